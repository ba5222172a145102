"""A batch's product by a weight (``_nn.weight_vector``, a classifier's last layer): the
vector kernel of batch 1 to 4 against NumPy in float64 over sizes that are not multiples of its
steps (rows of four, columns of a vector), every split of the columns and each row alone giving
one call's bits, and one row's kernel on the weight packed in panels giving those bits too;
the entry point's choice between the parallel loops, the packed GEMM (five rows and more) and
BLAS; a program's ``fc`` at batch 1, 3, 6 and 17 lowered onto it, against NumPy, in native
code."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib import gemm, pgemm, team
from pdjit.testing import assert_native

RNG = np.random.default_rng(53)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_parts_against_numpy_and_one_part(dtype):
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for m, k, n in ((1, 1, 5), (1, 3, 37), (1, 1027, 1000), (1, 8, 16), (2, 5, 37),
                    (3, 1027, 1000), (4, 9, 40)):
        x = RNG.uniform(-1, 1, (m, k)).astype(dtype)
        w = RNG.uniform(-1, 1, (k, n)).astype(dtype)
        want = x.astype(np.float64) @ w.astype(np.float64)
        one = np.full((m, n), np.nan, dtype)
        gemm._vector_parts(x, w, one, 1)
        np.testing.assert_allclose(one, want, rtol=tol, atol=tol, err_msg=f"{m}x{k}x{n}")
        for parts in (2, 3):
            split = np.full((m, n), np.nan, dtype)
            gemm._vector_parts(x, w, split, parts)
            np.testing.assert_array_equal(split, one, err_msg=f"{m}x{k}x{n} in {parts}")
        for i in range(m):  # (a row alone: its bits in any batch)
            row = np.full((1, n), np.nan, dtype)
            gemm._vector_parts(x[i:i + 1].copy(), w, row, 2)
            np.testing.assert_array_equal(row[0], one[i], err_msg=f"{m}x{k}x{n} row {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_panels_against_numpy_and_the_column_kernel(dtype):
    """One row by a weight packed in panels (``pgemm.packed_weight``), whole panels a part:
    against NumPy in float64, sizes not multiples of a panel (a last one part empty) nor of a
    vector, fewer panels than parts; the bits of :func:`gemm._vector_parts` in one part, in
    any number of parts."""
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for k, n in ((1, 5), (3, 37), (1027, 1000), (8, 16), (70, 130), (5, 64)):
        x = RNG.uniform(-1, 1, (1, k)).astype(dtype)
        w = RNG.uniform(-1, 1, (k, n)).astype(dtype)
        bp = pgemm.packed_weight(w)
        cols = np.full((1, n), np.nan, dtype)
        gemm._vector_parts(x, w, cols, 1)
        for parts in (1, 2, 3):
            got = np.full((1, n), np.nan, dtype)
            gemm._vector_panels(x, bp, got, parts)
            np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=f"{k}x{n} in {parts}")
            np.testing.assert_array_equal(got, cols, err_msg=f"{k}x{n} in {parts}")


def test_weight_vector_on_the_team_or_blas(monkeypatch, team_loops):
    """One to four rows by a weight large enough run a parallel loop once it is ready (one row
    by panels of the weight packed once, more by ranges of columns, over the loop threads; one
    row on one thread is BLAS's); a transposed weight, a small weight or a loop not ready yet
    run BLAS: each against NumPy."""
    ran = team_loops
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    monkeypatch.setattr(gemm, "VECTOR_MIN_VALUES", 64 * 40)
    k, n = 70, 40
    w = RNG.uniform(-1, 1, (k, n)).astype(np.float32)
    x = RNG.uniform(-1, 1, (1, k)).astype(np.float32)
    out = np.full((1, n), np.nan, np.float32)
    gemm.weight_vector(x, w, False, out)
    assert ran == [(gemm._vector_panels, 2, True)]
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=2e-5, atol=2e-5)
    one = np.full((1, n), np.nan, np.float32)
    gemm._vector_parts(x, w, one, 1)
    np.testing.assert_array_equal(out, one)       # two threads: one thread's bits
    x4 = RNG.uniform(-1, 1, (gemm.VECTOR_MAX_ROWS, k)).astype(np.float32)
    ran.clear()
    out4 = np.full((len(x4), n), np.nan, np.float32)
    gemm.weight_vector(x4, w, False, out4)
    assert ran == [(gemm._vector_parts, 2, True)]
    np.testing.assert_allclose(out4, x4.astype(np.float64) @ w, rtol=2e-5, atol=2e-5)
    for xs, ws, trans in ((x, w.T.copy(), True),                       # transposed
                          (x[:, :50].copy(), w[:50].copy(), False)):   # small
        ran.clear()
        got = np.full((xs.shape[0], n), np.nan, np.float32)
        gemm.weight_vector(xs, ws, trans, got)
        assert ran == []
        np.testing.assert_allclose(got, xs.astype(np.float64) @ (ws.T if trans else ws),
                                   rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(threads, "loop_threads", lambda: 1)  # one thread: one row is BLAS's,
    for xs, want in ((x, []), (x4, [(gemm._vector_parts, 1, True)])):  # more rows the loop's
        ran.clear()
        got = np.full((xs.shape[0], n), np.nan, np.float32)
        gemm.weight_vector(xs, w, False, got)
        assert ran == want, (xs.shape, ran)
        np.testing.assert_allclose(got, xs.astype(np.float64) @ w, rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    monkeypatch.setattr(team, "run", lambda loop, call: False)   # not ready: BLAS
    got = np.full((1, n), np.nan, np.float32)
    gemm.weight_vector(x, w, False, got)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=2e-5, atol=2e-5)


@pytest.fixture
def packed_calls(monkeypatch):
    """Every call of the packed GEMM's kernels (``pgemm._weight_rows``, of ``weight_rows``, and
    ``packed_gemm``) made through ``replay.kernel_call`` recorded: ``(its name, rows, packed
    weight's size)``."""
    calls, real = [], replay.kernel_call

    def kernel_call(fn, *args):
        if fn is pgemm._weight_rows:
            calls.append(("_weight_rows", (args[5] - args[4]) * args[7], args[3].size))
        elif fn is pgemm.packed_gemm:
            calls.append(("packed_gemm", args[0].shape[0], args[1].size))
        real(fn, *args)
    monkeypatch.setattr(replay, "kernel_call", kernel_call)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_vector_of_five_rows_and_more_runs_the_packed_gemm(dtype, monkeypatch,
                                                                  team_loops, packed_calls):
    """From five rows the product runs on the weight packed once (BLAS packs it at every
    call), transposed or not, rows no multiple of the tile's; from ``PACKED_MIN_ROWS`` rows
    split by blocks of rows over two threads, the same bits as one thread's call (fewer: on
    one); BLAS while the kernel is not ready (compiled ahead); each against NumPy in
    float64."""
    monkeypatch.setattr(gemm, "VECTOR_MIN_VALUES", 64 * 40)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    k, n = 70, 45
    w = RNG.uniform(-1, 1, (k, n)).astype(dtype)
    for m in (gemm.VECTOR_MAX_ROWS + 1, 13, pgemm.PACKED_MIN_ROWS, 23):
        rows = m >= pgemm.PACKED_MIN_ROWS
        x = RNG.uniform(-1, 1, (m, k)).astype(dtype)
        want = x.astype(np.float64) @ w.astype(np.float64)
        for ws, trans in ((w, False), (w.T.copy(), True)):
            packed_calls.clear()
            one = np.full((m, n), np.nan, dtype)
            gemm.weight_vector(x, ws, trans, one)
            assert packed_calls == [("_weight_rows" if rows else "packed_gemm", m,
                                     pgemm.packed_b_size(k, n, x.itemsize))], packed_calls
            np.testing.assert_allclose(one, want, rtol=tol, atol=tol, err_msg=f"{m} {trans}")
            with monkeypatch.context() as two_threads:
                two_threads.setattr(threads, "loop_threads", lambda: 2)
                two_threads.setattr(pgemm, "SPLIT_MIN_WORK", 1)
                team_loops.clear()
                two = np.full((m, n), np.nan, dtype)
                gemm.weight_vector(x, ws, trans, two)
            assert team_loops == ([(pgemm._row_parts, 2, True)] if rows else []), team_loops
            np.testing.assert_array_equal(two, one, err_msg=f"{m} {trans}")
            with monkeypatch.context() as not_on_disk:  # (a kernel not compiled ahead: BLAS)
                not_on_disk.setattr(team, "ready", lambda kernel, call: False)
                packed_calls.clear()
                blas = np.full((m, n), np.nan, dtype)
                gemm.weight_vector(x, ws, trans, blas)
            assert packed_calls == []
            np.testing.assert_allclose(blas, want, rtol=tol, atol=tol, err_msg=f"{m} {trans}")


def test_an_fc_at_batch_one_runs_on_the_vector_product(fresh_programs, monkeypatch,
                                                       team_loops, packed_calls):
    """A classifier's last layer (``fc`` of a pooled image, its weight a parameter): at batch
    1 the parallel loop over the weight's panels, at batch 3 the one over its columns, at
    batch 6 and 17 the packed GEMM; the bias and softmax after it, against NumPy, in native
    code."""
    main, startup = fresh_programs
    k, n = 96, 1500   # (144 000 values: above the size threshold, set lower here)
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [k, 1, 1])
        y = fluid.layers.fc(x, n, act="softmax", param_attr=fluid.ParamAttr(name="wv_w"),
                            bias_attr=fluid.ParamAttr(name="wv_b"))
    monkeypatch.setattr(gemm, "VECTOR_MIN_VALUES", 1 << 16)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)  # (one row on one thread: BLAS)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.global_scope()
    exe.run(startup)
    wv = np.asarray(scope.find_var("wv_w").get_tensor()).astype(np.float64)
    bv = np.asarray(scope.find_var("wv_b").get_tensor()).astype(np.float64)
    for batch in (1, 3, 6, 17):
        team_loops.clear()
        packed_calls.clear()
        xv = RNG.normal(size=(batch, k, 1, 1)).astype(np.float32)
        got, = exe.run(main, feed={"x": xv}, fetch_list=[y])
        assert_native(exe)
        logits = xv.reshape(batch, k).astype(np.float64) @ wv + bv
        want = np.exp(logits - logits.max(1, keepdims=True))
        want /= want.sum(1, keepdims=True)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        ran = [loop for loop, _, done in team_loops if done]
        assert ran == ([gemm._vector_panels] if batch == 1 else [gemm._vector_parts]
                       if batch <= gemm.VECTOR_MAX_ROWS else []), (batch, team_loops)
        assert bool(packed_calls) == (batch > gemm.VECTOR_MAX_ROWS), (batch, packed_calls)
    report = exe.explain(main, feed={"x": xv}, fetch_list=[y])
    assert "_nn.weight_vector(" in report, report


def test_a_matmul_by_a_weight_takes_it_and_a_transposed_one_stays_blas(fresh_programs,
                                                                      monkeypatch):
    """``matmul`` of a batch's rows by a weight takes the vector product; by the weight
    transposed (``transpose_Y``) it stays the op's own BLAS line; both against NumPy."""
    main, startup = fresh_programs
    k, n = 80, 1000
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [k])
        w = fluid.layers.create_parameter([k, n], "float32", name="mv_w")
        wt = fluid.layers.create_parameter([n, k], "float32", name="mv_wt")
        y = fluid.layers.matmul(x, w)
        yt = fluid.layers.matmul(x, wt, transpose_y=True)
    monkeypatch.setattr(gemm, "VECTOR_MIN_VALUES", 1 << 16)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)  # (one row on one thread: BLAS)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.global_scope()
    exe.run(startup)
    xv = RNG.normal(size=(1, k)).astype(np.float32)
    got, got_t = exe.run(main, feed={"x": xv}, fetch_list=[y, yt])
    assert_native(exe)
    for g, name, tr in ((got, "mv_w", False), (got_t, "mv_wt", True)):
        wv = np.asarray(scope.find_var(name).get_tensor()).astype(np.float64)
        np.testing.assert_allclose(g, xv @ (wv.T if tr else wv), rtol=1e-4, atol=1e-5)
    report = exe.explain(main, feed={"x": xv}, fetch_list=[y, yt])
    assert report.count("_nn.weight_vector(") == 1, report
