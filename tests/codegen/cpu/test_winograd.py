"""The 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) (``pdjit.codegen.cpu.lib.winograd``)
against a float64 convolution written here: odd and even planes, paddings 0-2 (top/left and
bottom/right apart), channel counts that are no multiple of a vector or of the register
blocks, the epilogue (bias, residual, clamp) on and off, batches of 1 and 3; the host entry
``conv._fwd_range`` taking it (and not for float64), a filter split along its output
channels or the output along its rows of tiles, as the threads split a one-sample
convolution, giving the whole's values, a weight
changed (a new array, or written in place and said so) seen by the next call, and a program
run by the executor on it."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import compiler, params
from pdjit.codegen.cpu import lib as nnlib
from pdjit.codegen.cpu.lib import conv, team, winograd
from pdjit.testing import assert_native

RNG = np.random.default_rng(45)
F32 = np.float32


def _conv(x, w, pt, pl, oh, ow):
    """Cross-correlation (NCHW) in float64: zero padding ``pt``/``pl`` on top/left, as much
    on the bottom/right as ``oh`` x ``ow`` outputs take."""
    n, c, h, wd = x.shape
    xp = np.zeros((n, c, oh + 2, ow + 2))
    hh, ww = min(h, oh + 2 - pt), min(wd, ow + 2 - pl)
    xp[:, :, pt:pt + hh, pl:pl + ww] = x[:, :, :hh, :ww]
    return sum(np.einsum("nchw,mc->nmhw", xp[:, :, i:i + oh, j:j + ow],
                         w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))


def _epilogue(y, bias, res, lo, hi):
    if bias.size:
        y = y + bias[:, None, None].astype(np.float64)
    if res.size:
        y = y + res.reshape(y.shape)
    return np.minimum(np.maximum(y, lo), hi)


E = np.empty(0, F32)


def test_against_a_float64_convolution():
    # (n, c, m, h, w, pt, pl, pb, pr, epilogue)
    cases = [(1, 3, 5, 5, 7, 1, 1, 1, 1, False), (3, 17, 33, 8, 8, 0, 0, 0, 0, True),
             (1, 17, 5, 13, 13, 1, 1, 1, 1, True), (3, 16, 40, 7, 5, 1, 0, 0, 1, False),
             (1, 4, 20, 6, 9, 2, 2, 2, 2, True), (1, 33, 17, 3, 4, 1, 1, 1, 1, True),
             (1, 8, 18, 1, 1, 2, 2, 2, 2, False),
             # rows of more than a vector of tiles: whole vectors stored plainly, then a part
             (1, 5, 7, 9, 70, 1, 1, 1, 1, True), (2, 3, 4, 6, 66, 0, 0, 0, 0, False)]
    for n, c, m, h, wd, pt, pl, pb, pr, ep in cases:
        x = RNG.normal(size=(n, c, h, wd)).astype(F32)
        w = RNG.normal(size=(m, c, 3, 3)).astype(F32)
        oh, ow = h + pt + pb - 2, wd + pl + pr - 2
        bias = RNG.normal(size=m).astype(F32) if ep else E
        res = RNG.normal(size=n * m * oh * ow).astype(F32) if ep else E
        lo, hi = (-0.5, 3.0) if ep else (-np.inf, np.inf)
        y = np.full((n, m, oh, ow), np.nan, F32)
        winograd.conv3x3(x, w, y, 0, n, pt, pl, bias, lo, hi, res)
        want = _epilogue(_conv(x, w, pt, pl, oh, ow), bias, res, lo, hi)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                   err_msg=str((n, c, m, h, wd, pt, pl, pb, pr, ep)))
    # a range of samples: the others untouched
    x = RNG.normal(size=(3, 4, 6, 6)).astype(F32)
    w = RNG.normal(size=(6, 4, 3, 3)).astype(F32)
    y = np.zeros((3, 6, 6, 6), F32)
    winograd.conv3x3(x, w, y, 1, 2, 1, 1, E, -np.inf, np.inf, E)
    assert not y[0].any() and not y[2].any()
    np.testing.assert_allclose(y[1], _conv(x, w, 1, 1, 6, 6)[1], rtol=1e-4, atol=1e-4)


def test_the_host_entry_takes_it_for_float32_alone():
    x = RNG.normal(size=(2, 16, 8, 7)).astype(F32)
    w = RNG.normal(size=(33, 16, 3, 3)).astype(F32)
    bias = RNG.normal(size=33).astype(F32)
    before = winograd.CALLS[0]
    y = np.empty((2, 33, 8, 7), F32)
    conv._fwd_range(x, w, y, 0, 2, 1, 1, 1, 1, 1, 1, 1, bias, 0.0, np.inf, E)
    assert winograd.CALLS[0] == before + 1
    want = _epilogue(_conv(x, w, 1, 1, 8, 7), bias, E, 0.0, np.inf)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    g = (1, 1, 1, 1, 1, 1, 1)
    assert winograd.takes(x, w, y, 2, *g)
    # not for float64 (the taps kernel), a stride of 2, groups, a 1x1 filter, few channels
    # or tiles
    assert not winograd.takes(x.astype(np.float64), w.astype(np.float64),
                              y.astype(np.float64), 2, *g)
    assert not winograd.takes(x, w, y[:, :, :3, :4], 2, 2, 2, 1, 1, 1, 1, 1)
    assert not winograd.takes(x, w[:, :8], y, 2, *g[:-1], 2)
    assert not winograd.takes(x, w[:, :, :1, :1], y, 2, 1, 1, 0, 0, 1, 1, 1)
    assert not winograd.takes(x[:, :3], w[:, :3], y, 2, *g)
    assert not winograd.takes(x, w[:16], y[:, :16], 2, *g)
    small = np.ascontiguousarray(x[:1, :, :6, :6])
    assert not winograd.takes(small, w, np.empty((1, 33, 6, 6), F32), 1, *g)


def test_a_filter_split_along_its_output_channels_gives_the_wholes_values(monkeypatch):
    """``conv._channel_calls`` splits a one-sample convolution into calls on slices of the
    filter, output, bias and residual: each takes its rows of the whole filter's transform
    (made once) and the values are the whole call's, bit for bit."""
    x = RNG.normal(size=(1, 16, 11, 11)).astype(F32)
    # the filter a view of a flat buffer (as loaded parameters are)
    w = RNG.normal(size=96 * 16 * 9 + 7).astype(F32)[7:].reshape(96, 16, 3, 3)
    bias = RNG.normal(size=96).astype(F32)
    res = RNG.normal(size=96 * 121).astype(F32)
    whole = np.empty((1, 96, 11, 11), F32)
    conv._fwd_range(x, w, whole, 0, 1, 1, 1, 1, 1, 1, 1, 1, bias, -1.0, 2.0, res)
    np.testing.assert_allclose(whole, _epilogue(_conv(x, w, 1, 1, 11, 11), bias, res, -1.0, 2.0),
                               rtol=1e-4, atol=1e-4)
    y = np.full_like(whole, np.nan)
    calls = conv._channel_calls(conv._channel_bounds(2, w, 1), x, w, y, 1, 1, 1, 1, 1, 1, 1,
                                bias, -1.0, 2.0, res)
    assert len(calls) == 2 and calls[1][1].shape[0] == 64
    before = winograd.CALLS[0]
    for args in calls:
        conv._fwd_range(*args)
    assert winograd.CALLS[0] == before + 2
    np.testing.assert_array_equal(y, whole)
    # split by the threads' entry: the whole transformed once, the parts on its rows
    made = []
    real = winograd._make
    monkeypatch.setattr(winograd, "_make", lambda a: (made.append(a.shape), real(a))[1])
    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    w2 = w.copy()
    for here in (False, True, True):  # on run_parts' helpers, then by a parallel loop
        monkeypatch.setattr(team, "COMPILE", here)  # (True: compiled at its first ask)
        y = np.full_like(whole, np.nan)
        conv.split_work(conv._fwd_range, 1, 1 << 30, x, w2, y, 1, 1, 1, 1, 1, 1, 1, bias,
                        -1.0, 2.0, res, head=3)
        np.testing.assert_array_equal(y, whole)
    assert team._READY[(conv._wino_parts, np.dtype(F32))] is True
    assert made == [w.shape]
    # a new array over the same memory, written since, is another filter: its own transform
    flat = w2.reshape(-1)
    flat[:] = RNG.normal(size=flat.size)
    w3 = flat.reshape(w.shape)
    y = np.full_like(whole, np.nan)
    conv.split_work(conv._fwd_range, 1, 1 << 30, x, w3, y, 1, 1, 1, 1, 1, 1, 1, bias,
                    -1.0, 2.0, res, head=3)
    np.testing.assert_allclose(y, _epilogue(_conv(x, w3, 1, 1, 11, 11), bias, res, -1.0, 2.0),
                               rtol=1e-4, atol=1e-4)


def test_parts_by_rows_of_tiles_and_by_channels_give_the_wholes_values(monkeypatch):
    """``conv._wino_parts`` (the parallel loop of a one-sample convolution) runs parts that
    are ranges of the output's rows of tiles (odd heights: a last row of tiles of one output
    row), of its channels, or both, each reading the image in place and the whole filter's
    transform: every split gives the whole call's values bit for bit, and NumPy's; the kernel
    refuses a range past the tiles."""
    monkeypatch.setattr(team, "COMPILE", True)  # (the loop compiled at its first ask)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    for c, h, wd, m, pad in ((16, 13, 11, 40, 1), (24, 20, 17, 32, 0), (17, 9, 30, 48, 2)):
        oh, ow = h + 2 * pad - 2, wd + 2 * pad - 2
        x = RNG.normal(size=(1, c, h, wd)).astype(F32)
        w = RNG.normal(size=(m, c, 3, 3)).astype(F32)
        bias = RNG.normal(size=m).astype(F32)
        res = RNG.normal(size=m * oh * ow).astype(F32)
        whole = np.empty((1, m, oh, ow), F32)
        conv._fwd_range(x, w, whole, 0, 1, 1, 1, pad, pad, 1, 1, 1, bias, -1.0, 2.0, res)
        np.testing.assert_allclose(whole, _epilogue(_conv(x, w, pad, pad, oh, ow), bias, res,
                                                    -1.0, 2.0), rtol=1e-4, atol=1e-4)
        th = (oh + 1) // 2
        for parts in ([(0, m, 0, 1), (0, m, 1, -1)],
                      [(0, m, 0, 2), (0, m, 2, 3), (0, m, 3, th - 1), (0, m, th - 1, th)],
                      [(0, 16, 0, -1), (16, m, 0, -1)],
                      [(0, 16, 0, 2), (16, m, 0, 2), (0, m, 2, -1)]):
            y = np.full_like(whole, np.nan)
            assert conv._wino_split((x, w, y, 1, 1, pad, pad, 1, 1, 1, bias, -1.0, 2.0, res),
                                    parts)
            np.testing.assert_array_equal(y, whole)
        ut = winograd.transformed(w)
        need = winograd.scratch_size.py_func(c, m, oh, ow, 1)
        for bad in ((0, m, 0, th + 1), (0, m, -1, 2)):
            with pytest.raises(ValueError, match="do not fit"):
                winograd._wino_range(x, ut, 0, whole, 0, 1, pad, pad, bias, -1.0, 2.0, res,
                                     winograd._scratch(need), *bad[2:])


def test_a_large_plane_splits_by_rows_and_a_small_one_by_channels(monkeypatch):
    """Split over two threads (``split_work``), a one-sample convolution whose parts get
    ``_WINO_ROW_TILES`` tiles or more splits by rows of tiles (every output channel in each
    part: the positions a split by positions of the layer before wrote on the same thread);
    one of fewer tiles by output channels. Both give one thread's values bit for bit."""
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    seen = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: (
        loop is conv._wino_parts and seen.append(call[3].tolist())) or real(loop, call))
    for h, want in ((30, [[0, 64, 0, 7], [0, 64, 7, 15]]), (12, [[0, 32, 0, -1],
                                                                  [32, 64, 0, -1]])):
        x = RNG.normal(size=(1, 16, h, h)).astype(F32)
        w = RNG.normal(size=(64, 16, 3, 3)).astype(F32)
        args = (1, 1, 1, 1, 1, 1, 1, E, -np.inf, np.inf, E)
        one = np.empty((1, 64, h, h), F32)
        conv._fwd_range(x, w, one, 0, 1, *args)
        y = np.full_like(one, np.nan)
        seen.clear()
        conv.split_work(conv._fwd_range, 1, 1 << 30, x, w, y, *args, head=3)
        assert seen == [want]
        np.testing.assert_array_equal(y, one)


def test_a_batch_split_takes_the_kernel_the_whole_takes(monkeypatch):
    """A batch whose tiles reach Winograd's threshold only together: split over threads, each
    part still runs it, and the result is the one thread's bit for bit."""
    x = RNG.normal(size=(8, 64, 4, 4)).astype(F32)   # 4 tiles a sample, 32 in the batch
    w = RNG.normal(size=(64, 64, 3, 3)).astype(F32)
    args = (1, 1, 1, 1, 1, 1, 1, E, -np.inf, np.inf, E)
    ys = {}
    for parts in (1, 2):
        monkeypatch.setattr(conv, "_parts", lambda n, work, p=parts: p)
        before = winograd.CALLS[0]
        ys[parts] = np.empty((8, 64, 4, 4), F32)
        conv.split_work(conv._fwd_range, 8, 1 << 30, x, w, ys[parts], *args, head=3)
        assert winograd.CALLS[0] == before + parts
    np.testing.assert_array_equal(ys[1], ys[2])
    np.testing.assert_allclose(ys[1], _conv(x, w, 1, 1, 4, 4), rtol=1e-4, atol=1e-4)


def test_a_changed_weight_is_seen():
    x = RNG.normal(size=(1, 16, 12, 12)).astype(F32)
    w = RNG.normal(size=(32, 16, 3, 3)).astype(F32)
    y = np.empty((1, 32, 12, 12), F32)
    before = winograd.CALLS[0]
    for step in range(3):
        if step == 1:
            w = RNG.normal(size=w.shape).astype(F32)  # a new array
        elif step == 2:
            w[...] = RNG.normal(size=w.shape)  # in place, as a run that writes it says
            params.written([w])
        conv._fwd_range(x, w, y, 0, 1, 1, 1, 1, 1, 1, 1, 1, E, -np.inf, np.inf, E)
        np.testing.assert_allclose(y, _conv(x, w, 1, 1, 12, 12), rtol=1e-4, atol=1e-4)
    assert winograd.CALLS[0] == before + 3


def test_a_program_on_it(fresh_programs):
    """The executor's host driver runs a 3x3 convolution with its bias and relu on it; a
    weight given a new array in the Scope, and one written by a program, are seen."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [16, 8, 8])
    h = fluid.layers.conv2d(x, 32, 3, padding=1, act="relu",
                            param_attr=fluid.ParamAttr(name="wg_w"),
                            bias_attr=fluid.ParamAttr(name="wg_b"))
    with fluid.program_guard(double := fluid.Program(), fluid.Program()):
        wv = fluid.layers.create_parameter([32, 16, 3, 3], "float32", name="wg_w")
        fluid.layers.assign(fluid.layers.scale(wv, 2.0), output=wv)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    scope = fluid.global_scope()
    xv = RNG.normal(size=(2, 16, 8, 8)).astype(F32)

    def check():
        before = winograd.CALLS[0]
        (got,) = exe.run(main, feed={"x": xv}, fetch_list=[h])
        assert_native(exe)
        assert winograd.CALLS[0] > before
        w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("wg_w", "wg_b"))
        want = np.maximum(_conv(xv, w, 1, 1, 8, 8) + b[:, None, None], 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        return got

    first = check()
    scope.find_var("wg_w").get_tensor().set(
        RNG.normal(size=(32, 16, 3, 3)).astype(F32), fluid.CPUPlace())
    second = check()
    exe.run(double)
    third = check()
    assert not np.array_equal(first, second) and not np.array_equal(second, third)
    # the lowering names the entry whose compile jobs include Winograd's (the plain one's do
    # not), and they are the signatures it ran
    assert not [fn for fn, _ in nnlib.library_jobs(["conv._fwd_range"], np.float32)
                if fn in (winograd._wino_range, winograd._filter_transform)]
    jobs = [(fn, types) for fn, types in nnlib.library_jobs(["conv._fwd_range_3x3"], np.float32)
            if fn in (winograd._wino_range, winograd._filter_transform)]
    assert len(jobs) == 2
    for fn, types in jobs:
        assert tuple(compiler._numba_type(t) for t in types) in fn.overloads


def test_the_filter_transform_is_g_w_gt():
    """``U[i * 4 + j, m, c] = (G w[m, c] G^T)[i, j]``, against the matrix products in float64."""
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    w = RNG.normal(size=(5, 7, 3, 3)).astype(F32)
    want = np.einsum("ij,mcjk,lk->ilmc", G, w.astype(np.float64), G).reshape(16, 5, 7)
    got = winograd._make(w)
    assert got.dtype == F32 and got.shape == (16, 5, 7)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

