"""A replay's kernel calls made by one native call (``pdjit.codegen.cpu.callchain``).

Oracle: NumPy written here, and the same kernels called from Python. A chain must make every
call with its arguments (arrays of any rank, layout and data type, ints, floats, bools), in
order; stop at a call that raises and say which (the replay then makes that call from Python,
which raises its error); and leave in Python what it cannot take.
"""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu import callchain, replay

RNG = np.random.default_rng(11)


@numba.njit
def _axpy(x, y, out, a, relu):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = a * x[i, j] + y[i, j]
            out[i, j] = max(v, 0.0) if relu else v


@numba.njit
def _count(idx, hist, n):
    for i in range(idx.size):
        if idx[i] < 0 or idx[i] >= n:
            raise ValueError("an index out of range")
        hist[idx[i]] += 1


def _compiled(fn, args):
    """``fn`` compiled for ``args`` (as the recorded run compiled its kernels)."""
    fn.compile(tuple(fn.typeof_pyval(a) for a in args))
    return fn, args


def _chain(*calls):
    (chain,) = callchain.build([[callchain.native(*_compiled(fn, args)) for fn, args in calls]])
    return chain


def test_a_chain_makes_each_call_with_its_arguments_in_order():
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    y = RNG.standard_normal((5, 7)).astype(np.float32)
    xt = RNG.standard_normal((7, 5)).T  # (float64, Fortran order: strides not C's)
    mid, out, out64 = (np.zeros((5, 7), np.float32), np.zeros((5, 7), np.float32),
                       np.zeros((5, 7)))
    idx = np.array([0, 3, 3, 1], np.int64)
    hist = np.zeros(4, np.int32)
    chain = _chain((_axpy, (x, y, mid, 2.0, True)), (_axpy, (mid, y, out, -0.5, False)),
                   (_axpy, (xt, xt, out64, 3, False)), (_count, (idx, hist, 4)))
    assert chain() == 0
    m = np.maximum(2.0 * x + y, 0)
    np.testing.assert_allclose(mid, m, rtol=1e-6)
    np.testing.assert_allclose(out, -0.5 * m + y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out64, 4 * xt)
    np.testing.assert_array_equal(hist, [1, 1, 0, 2])
    assert chain() == 0  # (made again: the same arrays, their values the next run's)
    np.testing.assert_array_equal(hist, [2, 2, 0, 4])


def test_a_chain_stops_at_a_call_that_raises_and_says_which():
    hist = np.zeros(3, np.int64)
    good, bad = np.array([0, 2], np.int64), np.array([1, 5], np.int64)
    chain = _chain((_count, (good, hist, 3)), (_count, (bad, hist, 3)),
                   (_count, (good, hist, 3)))
    assert chain() == 2  # (call 1 raised: call 2 not made; call 0's work kept)
    np.testing.assert_array_equal(hist, [1, 1, 1])
    with pytest.raises(ValueError, match="out of range"):
        _count(bad, hist, 3)  # (from Python, the same call raises its error)


def test_what_a_chain_cannot_take_is_named():
    with pytest.raises(callchain.Unsupported):
        callchain.native(np.copyto, (np.zeros(2), np.ones(2)))
    with pytest.raises(callchain.Unsupported):
        callchain.native(_count, ((1, 2), np.zeros(2), 2))
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(callchain.Unsupported):  # (not compiled for these types)
        callchain.native(_axpy, (x.astype(np.int8), x, x, 1.0, True))


def _recording(ops, outputs, inputs=()):
    return replay.Recording(ops, set(), list(inputs), [], [], outputs, replay._state())


def test_a_recording_goes_native_where_it_may_and_raises_from_python(monkeypatch):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    buf = np.zeros((3, 4), np.float32)  # (an input's buffer: passed in place)
    mid, out = np.zeros_like(x), np.zeros_like(x)
    idx = np.array([0, 1], np.int64)
    hist = np.zeros(2, np.int64)
    ops = [(_axpy, (buf, x, mid, 1.0, False), None, None),
           (_axpy, (mid, x, out, 2.0, False), None, None),
           (_count, (idx, hist, 2), None, None),
           (_axpy, (out, x, out, 1.0, True), None, None)]
    for fn, args, _, _ in ops:
        _compiled(fn, args)
    rec = _recording(ops, (out,), inputs=[(0, buf)])
    assert rec.uses == {0: [(0, 0)]}
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)  # (compiled here, not on a thread)
    rec.native()
    assert rec.built() and rec.go_native()
    assert rec.parts[0] == 0 and rec.parts[1][:2] == (1, 4)  # (op 0 reads the input)
    v = RNG.standard_normal((3, 4)).astype(np.float32)
    (got,) = rec.replay([v])
    want = np.maximum(2.0 * (v + x) + x + x, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(hist, [1, 1])
    idx[1] = 7  # (a value the kernel refuses: the chain stops there, Python raises)
    with pytest.raises(ValueError, match="out of range"):
        rec.replay([v])
    # (op 2 counted idx[0] natively before it stopped, then again from Python before it
    # raised: a failed call is made twice, its run failed either way)
    np.testing.assert_array_equal(hist, [3, 1])


def _spin_body(out, n):
    x = 0.0
    for _ in range(n):
        x = x * 0.999999 + 1.0
    out[0] = x


_spin_free, _spin_held = numba.njit(nogil=True)(_spin_body), numba.njit(_spin_body)


@pytest.mark.parametrize("kernel,frees", [(_spin_free, True), (_spin_held, False)])
def test_a_chain_releases_the_gil_where_its_kernels_do(kernel, frees):
    """Kernels compiled ``nogil`` (the library's): the chain lets other Python threads run
    meanwhile (predictors on several threads); else it holds the GIL, as their calls did. (A
    Python thread stamps the time while the chain runs: holding the GIL, the chain leaves a
    gap in its stamps as long as the call.)"""
    import threading
    import time

    out = np.zeros(1)
    chain = _chain((kernel, (out, 30_000_000)), (kernel, (out, 30_000_000)))
    t0 = time.perf_counter()
    assert chain() == 0
    alone = time.perf_counter() - t0
    stamps, stop = [], threading.Event()

    def counter():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=counter)
    t.start()
    try:
        while len(stamps) < 100:
            time.sleep(0.001)
        assert chain() == 0
    finally:
        stop.set()
        t.join()
    assert out[0] > 0 and alone > 0.04, alone
    gap = float(np.diff(stamps).max())
    assert (gap < 0.5 * alone) == frees, (gap, alone)


@numba.njit(nogil=True)
def _put(out, u, i, flag):
    out[0] = u
    out[1] = i
    out[2] = 1 if flag else 0


def test_numbers_reach_the_kernel_as_its_types_hold_them():
    """An unsigned 64-bit value past the signed range, a negative int, a bool and NumPy's
    bool, as the kernel called from Python gets them."""
    for flag in (True, np.bool_(True)):
        out = np.zeros(3, np.uint64)
        want = np.zeros(3, np.uint64)
        args = (out, np.uint64(2**64 - 3), -5, flag)
        _put(want, *args[1:])
        assert _chain((_put, args), (_put, args))() == 0
        np.testing.assert_array_equal(out, want)
        assert out[0] == 2**64 - 3 and out[2] == 1
