"""Each run's threads are capped at the cores other processes leave free
(``threads.begin_run``): with a thread count asked for, a run on a machine with a busy core
runs its BLAS calls, parallel loops and split batches on the caller's thread, and gives the
same results as a run on every thread. Checked with ``free_cores`` forced, never by timing."""
import numba
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.lib import conv as convlib
from pdjit.codegen.cpu.lib import rnn as rnnlib
from pdjit.testing import assert_native


@pytest.fixture
def two_asked(monkeypatch):
    """``set_num_threads(2)`` for the test (Numba's count and OpenBLAS's restored after);
    ``free[0]``: the free cores ``free_cores`` reports."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    free = [2]
    saved_numba = numba.get_num_threads()
    monkeypatch.setattr(threads, "_applied", 2)
    monkeypatch.setattr(threads, "free_cores", lambda: free[0])
    applied = []
    monkeypatch.setattr(threads, "_setters", [[applied.append]])  # OpenBLAS's count, recorded
    threads._run_blas[0] = threads._run_local.loops = None
    yield free, applied
    threads._run_blas[0] = threads._run_local.loops = None
    numba.set_num_threads(saved_numba)


def test_begin_run_caps_the_counts_at_the_free_cores(two_asked):
    free, applied = two_asked
    threads.begin_run()
    assert applied[-1] == 2 and numba.get_num_threads() == 2
    free[0] = 1                                        # another process took a core
    threads.begin_run()
    assert applied[-1] == 1 and numba.get_num_threads() == 1
    assert threads.gemm_threads(1 << 30) == 1 and threads.loop_threads() == 1
    n = len(applied)
    threads.begin_run()                                # unchanged: nothing set again
    assert len(applied) == n
    free[0] = 2
    threads.begin_run()
    assert applied[-1] == 2 and numba.get_num_threads() == 2


def _model():
    """A 2-layer bidirectional LSTM over [B, 5, 6] and a 3x3 convolution over [B, 3, 7, 7]."""
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 3
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[5, 6], dtype="float32")
        img = L.data(name="img", shape=[3, 7, 7], dtype="float32")
        h0 = L.fill_constant_batch_size_like(x, [4, -1, 8], "float32", 0.0, input_dim_idx=0,
                                             output_dim_idx=1)
        seq, _, _ = L.lstm(x, h0, h0, max_len=5, hidden_size=8, num_layers=2,
                           is_bidirec=True, is_test=True)
        feat = L.relu(L.conv2d(img, num_filters=5, filter_size=3, padding=1))
    return main, startup, [seq, feat]


def test_threaded_and_serial_runs_agree(two_asked, monkeypatch):
    free, _ = two_asked
    monkeypatch.setattr(rnnlib, "SPLIT_MIN_WORK", 0)         # tiny shapes split too
    monkeypatch.setattr(convlib, "_PARALLEL_MIN_WORK", 0)
    slices = []
    real_slices = rnnlib._slices
    monkeypatch.setattr(rnnlib, "_slices", lambda *a: slices.append(real_slices(*a)) or
                        slices[-1])
    main, startup, fetch = _model()
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((4, 5, 6)).astype("float32"),
            "img": rng.standard_normal((4, 3, 7, 7)).astype("float32")}
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    outs = {}
    for n in (2, 1, 2):
        free[0] = n
        outs[n] = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
        assert slices[-1] == n and numba.get_num_threads() == n
    assert_native(exe)
    ref = fluid.Executor(mode="reference").run(main, feed=feed, fetch_list=fetch, scope=scope)
    for a, b, r in zip(outs[2], outs[1], ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)
