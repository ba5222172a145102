"""The size-aware BLAS thread policy of host-driver GEMMs (``threads.gemm_threads``): a product
of ``GEMM_PARALLEL_MIN_WORK`` multiply-adds or more runs on every core, a smaller one on one
thread, and an asked-for count (``set_num_threads`` / ``PDJIT_NUM_THREADS``) serves every
product; either way other processes' busy cores are left out (``threads.free_cores``).
Checked through ``threads.gemm_trace`` and spies, never by timing."""
import os

import numba
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.lib import gemm as nngemm
from pdjit.codegen.cpu.lib import pgemm, team
from pdjit.codegen.cpu.lowerings import matmul as mm
from pdjit.testing import assert_native

CORES = numba.config.NUMBA_NUM_THREADS


@pytest.fixture
def default_threads(monkeypatch):
    """pdjit's default: no thread count asked for; every decision recorded."""
    monkeypatch.delenv("PDJIT_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_applied", None)
    # the variable is read once per process: what a test sets it to must not outlive the test
    monkeypatch.setattr(threads, "_default_threads", None)
    monkeypatch.setattr(threads, "free_cores", lambda: CORES)   # an idle machine
    trace = []
    monkeypatch.setattr(threads, "gemm_trace", trace)
    return trace


def test_the_decision_by_size_and_an_asked_count(default_threads, monkeypatch):
    big = threads.GEMM_PARALLEL_MIN_WORK
    assert threads.gemm_threads(big) == CORES
    assert threads.gemm_threads(big - 1) == 1
    assert threads.gemm_threads(8 * 256 * 10) == 1
    monkeypatch.setattr(threads, "free_cores", lambda: 1)      # other processes keep the rest
    assert threads.gemm_threads(big * 4) == 1
    monkeypatch.setattr(threads, "free_cores", lambda: CORES)
    monkeypatch.setattr(threads, "_applied", 1)            # set_num_threads(1)
    assert threads.gemm_threads(big * 4) == 1
    monkeypatch.setattr(threads, "_applied", None)
    monkeypatch.setenv("PDJIT_NUM_THREADS", "3")            # the variable (read once: again
    monkeypatch.setattr(threads, "_default_threads", None)  # here, as a new process reads it)
    monkeypatch.setattr(threads, "free_cores", lambda: 8)
    assert threads.gemm_threads(big) == threads.get_num_threads() == 3
    assert threads.gemm_threads(10) == 3
    monkeypatch.setattr(threads, "free_cores", lambda: 1)   # asked for, but a core is busy
    assert threads.gemm_threads(big) == 1
    assert threads.blas_threads() == 1 and threads.loop_threads() == 1
    assert threads.max_loop_threads() == 3                  # what plans are built for


def _two_fcs():
    """A large product (256 x 512 x 256: 2**25 multiply-adds) and a small one (4 x 8 x 3)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[256, 512], dtype="float32",
                              append_batch_size=False)
        s = fluid.layers.data(name="s", shape=[4, 8], dtype="float32", append_batch_size=False)
        big = fluid.layers.fc(x, 256, bias_attr=False,
                              param_attr=fluid.ParamAttr(name="wbig"))
        small = fluid.layers.fc(s, 3, bias_attr=False, param_attr=fluid.ParamAttr(name="wsmall"))
    return main, big, small


def _numpy_blas_spy(monkeypatch):
    """The thread count of NumPy's BLAS seen inside each call ``with_numpy_blas`` makes."""
    set_, get = threads._openblas(os.path.join(threads._site(np), "numpy.libs"))
    if set_ is None or get is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS with a thread count")
    seen = []
    orig = threads.with_numpy_blas

    def spy(n, fn, *args, **kwargs):
        def inner(*a, **k):
            seen.append(get())
            return fn(*a, **k)
        return orig(n, inner, *args, **kwargs)

    monkeypatch.setattr(threads, "with_numpy_blas", spy)
    return seen


def test_a_large_host_gemm_runs_on_every_core_a_small_on_one(default_threads, monkeypatch):
    # (the products as BLAS calls: by weights they run on the weights packed once, their rows
    # split over the loop threads, tests/codegen/cpu/test_packed_gemm.py)
    monkeypatch.setattr(mm, "_weight", lambda ctx, xn: False)
    seen = _numpy_blas_spy(monkeypatch)
    main, big, small = _two_fcs()
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((512, 256)).astype(np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    xv = rng.standard_normal((256, 512)).astype(np.float32)
    sv = rng.standard_normal((4, 8)).astype(np.float32)
    scope = fluid.Scope()
    scope.var("wbig").value, scope.var("wsmall").value = w1, w2
    exe = fluid.Executor(strict=True)
    got_big, got_small = exe.run(main, feed={"x": xv, "s": sv}, fetch_list=[big, small],
                                 scope=scope)
    np.testing.assert_allclose(got_big, xv.astype(np.float64) @ w1, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got_small, sv.astype(np.float64) @ w2, rtol=1e-5, atol=1e-5)
    assert_native(exe)
    assert (256 * 512 * 256, CORES) in default_threads
    assert (4 * 8 * 3, 1) in default_threads
    assert seen == ([CORES] if CORES > 1 else [])   # only the large one switched NumPy's BLAS
    # an asked-for count serves both, whatever their size
    default_threads.clear()
    monkeypatch.setattr(threads, "_applied", 1)
    exe.run(main, feed={"x": xv, "s": sv}, fetch_list=[big, small], scope=scope)
    assert sorted(n for _, n in default_threads) == [1, 1]


def test_a_large_batch_of_products_is_split_over_threads(default_threads, monkeypatch):
    parts = []
    orig = nngemm._split_batches

    def spy(a, b, ta, tb, alpha, c, n):
        parts.append(n)
        return orig(a, b, ta, tb, alpha, c, n)

    monkeypatch.setattr(nngemm, "_split_batches", spy)
    monkeypatch.setattr(threads, "GEMM_PARALLEL_MIN_WORK", 100)  # small shapes count as large
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 6, 7)).astype(np.float32)
    y = rng.standard_normal((5, 4, 7)).astype(np.float32)     # transposed: x @ y^T
    it = np.array([5], np.int64)
    out = np.empty((5, 6, 4), np.float32)
    nngemm.batched_gemm(x, y, False, True, 0.5, it, it, it, it, out)
    want = 0.5 * np.einsum("bik,bjk->bij", x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert default_threads == [(5 * 6 * 7 * 4, CORES)]
    assert parts == ([min(CORES, 5)] if CORES > 1 else [])
    # a broadcast operand: np.matmul with NumPy's BLAS at the count, not split
    parts.clear()
    one = np.array([1], np.int64)
    nngemm.batched_gemm(x, y[:1], False, True, 1.0, it, it, one, it, out)
    want = np.einsum("bik,jk->bij", x.astype(np.float64), y[0].astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert parts == []
    # products of 16 rows or more on the packed GEMM: split on run_parts' helpers (the
    # parallel loop not on disk), then by the loop; one thread's bits either way
    x = rng.standard_normal((5, 20, 7)).astype(np.float32)
    one = np.empty((5, 20, 4), np.float32)
    nngemm.packed_batches(x, y, True, 0.5, one, 0, 5)
    np.testing.assert_allclose(one, 0.5 * np.einsum("bik,bjk->bij", x.astype(np.float64),
                                                    y.astype(np.float64)), rtol=1e-5, atol=1e-5)
    for here in (False, True):  # (True: the loop compiled at its first ask)
        monkeypatch.setattr(team, "COMPILE", here)
        out = np.full((5, 20, 4), np.nan, np.float32)
        nngemm.batched_gemm(x, y, False, True, 0.5, it, it, it, it, out)
        assert np.array_equal(out, one)
    if CORES > 1:
        assert team._READY[(pgemm.batches_by_team, np.dtype(np.float32))]


def test_a_batch_below_blas_size_splits_by_the_parallel_loop(default_threads, monkeypatch):
    """A batch of products on the packed GEMM below ``GEMM_PARALLEL_MIN_WORK`` (one BLAS
    thread) of ``gemm.TEAM_MIN_WORK`` multiply-adds or more (a BERT-like encoder's attention
    at batch 1: 4 heads of 128 x 64 x 128) splits over the loop threads by the parallel loop
    where it is ready, else runs on one thread (no helpers): one thread's bits either way."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 128, 64)).astype(np.float32)
    y = rng.standard_normal((4, 128, 64)).astype(np.float32)     # transposed: x @ y^T
    it = np.array([4], np.int64)
    work = 4 * 128 * 64 * 128
    assert nngemm.TEAM_MIN_WORK <= work < threads.GEMM_PARALLEL_MIN_WORK
    one = np.empty((4, 128, 128), np.float32)
    nngemm.packed_batches(x, y, True, 0.5, one, 0, 4)
    np.testing.assert_allclose(one, 0.5 * np.einsum("bik,bjk->bij", x.astype(np.float64),
                                                    y.astype(np.float64)), rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    loops = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: loops.append(
        (loop, call[-1], real(loop, call))) or loops[-1][2])
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    for here in (False, True):  # (True: the loop compiled at its first ask)
        monkeypatch.setattr(team, "COMPILE", here)
        monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
        out = np.full((4, 128, 128), np.nan, np.float32)
        nngemm.batched_gemm(x, y, False, True, 0.5, it, it, it, it, out)
        assert np.array_equal(out, one)
    assert default_threads == [(work, 1), (work, 1)]
    assert loops[-1] == (pgemm.batches_by_team, 2, True)


def test_free_cores_reads_a_count():
    assert 1 <= threads.free_cores() <= (os.cpu_count() or 1)
