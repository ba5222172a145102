"""Pointwise (1x1) convolutions on pdjit's packed GEMM (``pdjit.codegen.cpu.lib.pointwise``):
both tile orientations against a NumPy oracle written here, over channel counts and planes
that are no multiple of the tile (``MR`` channels, ``NR`` pixels), each
piece of the epilogue alone and together, one sample and several; and in a program: a
1x1 convolution + bias + residual + relu on its filter packed once, the packed copy made
again after a training program writes the filter."""
import weakref

import numpy as np

import pdjit as fluid
from pdjit.codegen import params
from pdjit.codegen.cpu.lib import pgemm, pointwise
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing import assert_native

RNG = np.random.default_rng(43)
INF = np.inf


def _oracle(x, w, bias, res, lo, hi):
    n, c, h, wd = x.shape
    y = np.einsum("mc,ncp->nmp", w.reshape(w.shape[0], c).astype(np.float64),
                  x.reshape(n, c, h * wd).astype(np.float64))
    if bias.size:
        y += bias.astype(np.float64)[None, :, None]
    y = y.reshape(n, w.shape[0], h, wd)
    if res.size:
        y += res.reshape(y.shape)
    return np.minimum(np.maximum(y, lo), hi)


def _operands(n, c, m, h, wd):
    """An image, a 1x1 filter, a bias and a residual (flat) of these sizes, float32."""
    return (RNG.standard_normal((n, c, h, wd)).astype(np.float32),
            RNG.standard_normal((m, c, 1, 1)).astype(np.float32),
            RNG.standard_normal(m).astype(np.float32),
            RNG.standard_normal(n * m * h * wd).astype(np.float32))


def test_both_orientations_against_numpy():
    e = np.empty(0, np.float32)
    # (batch, C, M, H, W, the kernel): planes of 35 and 24 pixels take the transposed tiles
    # (2), the others the row tiles (1), any number of input channels: 144, 196 and 256
    # pixels of long sums (their panels packed), 169 pixels of short sums, 1056 (16 panels
    # and 32 pixels), an image of 130 channels over 600 pixels, one of 90 beyond
    # pgemm._BLOCK_BYTES
    for n, c, m, h, wd, kind in [(1, 19, 23, 5, 7, 2), (3, 16, 70, 4, 6, 2),
                                 (1, 130, 64, 12, 12, 1), (1, 256, 128, 14, 14, 1),
                                 (2, 300, 70, 14, 14, 1), (1, 48, 40, 13, 13, 1),
                                 (1, 256, 128, 16, 16, 1), (2, 21, 17, 32, 33, 1),
                                 (1, 23, 16, 32, 32, 1), (1, 130, 37, 24, 25, 1),
                                 (2, 90, 20, 40, 41, 1)]:
        assert pointwise._choice(m, c, h * wd) == kind
        x, w, bias, res = _operands(n, c, m, h, wd)
        ap = pointwise.pointwise_weight(w, h * wd)
        step = 48 if pointwise._kind(m, c, h * wd, True) == 3 else 64  # (panels of channels)
        assert ap.size == (pgemm.packed_rows_size(m, c) if kind == 1
                           else -(-m // step) * step * c)
        assert pointwise.pointwise_weight(w, h * wd) is ap     # kept beside the filter
        for b, r, lo, hi in [(e, e, -INF, INF), (bias, e, -INF, INF), (e, res, -INF, INF),
                             (e, e, 0.0, INF), (bias, res, 0.0, 6.0)]:
            y = np.full((n, m, h, wd), np.nan, np.float32)
            pointwise.pointwise_range(x, w, ap, y, 0, n, 1, 1, 0, 0, 1, 1, 1, b, lo, hi, r)
            np.testing.assert_allclose(y, _oracle(x, w, b, r, lo, hi), rtol=1e-4, atol=1e-4)
        if n > 1:  # a range of samples leaves the others alone
            y = np.full((n, m, h, wd), np.nan, np.float32)
            pointwise.pointwise_range(x, w, ap, y, 1, 2, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, 6.0,
                                      res)
            want = _oracle(x, w, bias, res, 0.0, 6.0)
            np.testing.assert_allclose(y[1], want[1], rtol=1e-4, atol=1e-4)
            assert np.isnan(y[0]).all() and np.isnan(y[2:]).all()
    # a run that may write the filter in place: packed again
    params.written([w])
    assert pointwise.pointwise_weight(w, 1024) is not ap
    # other dtypes stay with conv._fwd_range: nothing packed
    assert pointwise.pointwise_weight(w.astype(np.float64), 256).size == 0


def test_stand_in_while_the_packed_kernels_compile(monkeypatch):
    """While a worker compiles the row or the transposed tiles beside the runs
    (``team.standing_in``), ``pointwise_range`` runs NumPy's calls in their place
    (``conv._taps_numpy`` on the unpacked filter): against the oracle, both orientations,
    the whole epilogue, a range of samples."""
    from pdjit.codegen.cpu.lib import team

    calls = []
    for name in ("pointwise_rows", "pointwise_cols"):
        monkeypatch.setattr(pointwise, name, lambda *a: calls.append(a))
    monkeypatch.setattr(team, "standing_in",
                        lambda k: k in (pointwise.pointwise_rows, pointwise.pointwise_cols))
    for n, c, m, h, wd, kind in [(3, 16, 70, 4, 6, 2), (2, 300, 70, 14, 14, 1)]:
        assert pointwise._choice(m, c, h * wd) == kind
        x, w, bias, res = _operands(n, c, m, h, wd)
        ap = pointwise.pointwise_weight(w, h * wd)
        y = np.full((n, m, h, wd), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, y, 1, n, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, 6.0, res)
        np.testing.assert_allclose(y[1:], _oracle(x, w, bias, res, 0.0, 6.0)[1:], rtol=1e-4,
                                   atol=1e-4)
        assert np.isnan(y[0]).all()
    assert not calls


def test_row_tiles_sweep_wide_images_by_blocks_of_pixels():
    """``pgemm.pointwise_rows`` on images wider than ``pgemm._BLOCK_BYTES``, swept by blocks
    of pixels: 1640 pixels of 100 channels (a block of 1280, then 360: no whole number of
    vectors), 4160 of 128 (4 of 1024, then 64), against the NumPy oracle."""
    e = np.empty(0, np.float32)
    for n, c, m, h, wd in [(2, 100, 124, 40, 41), (1, 128, 130, 64, 65)]:
        assert c * h * wd * 4 > pgemm._BLOCK_BYTES
        x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
        w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        res = RNG.standard_normal(n * m * h * wd).astype(np.float32)
        ap = np.empty(pgemm.packed_rows_size(m, c), np.float32)
        pgemm.pack_a(np.ascontiguousarray(w.reshape(m, c)), ap)
        for b, r, lo, hi in [(e, e, -INF, INF), (bias, res, 0.0, 6.0)]:
            y = np.full((n, m, h, wd), np.nan, np.float32)
            pgemm.pointwise_rows(x, ap, y, 0, n, b, lo, hi, r)
            np.testing.assert_allclose(y, _oracle(x, w, b, r, lo, hi), rtol=1e-4, atol=1e-4)


def test_row_tiles_last_panel_of_one_vector():
    """A block's last panel of pixels that fills one vector runs on a narrower tile
    (``pgemm._conv_micro1``), one of two to four on the full tile under its mask: 28x28 (12
    panels and 16 pixels), 65 pixels (one panel and one), 10 pixels alone, 729 (11 panels
    and 25), 83 (one and 19), 111 (one and 47), in float32 and float64 (vectors of 8),
    against the NumPy oracle; in float32 each output the same bits in two ranges split at a
    panel (the parts of a split by pixels, ``pgemm.rows_by_pixels``). Channels below and from
    ``PACK_MIN_TILES`` tiles and ``PACK_MIN_CHANNELS``: the image read in place by every tile,
    or packed by the first tile of each block for the others (``pgemm._rows_pixels``); and
    tiles up to and past ``PANEL_MAX_TILES``: each panel under every tile, or blocks of
    pixels under one tile after another. Output channels of every remainder of ``MR``: a
    last tile of 1-4 (``TAIL_ROWS``) channels on the narrower tile
    (``pgemm._conv_micro_tail``), of 5 on a whole one."""
    e = np.empty(0, np.float32)
    shapes = [(40, 13, 28, 28), (17, 7, 5, 13), (9, 12, 2, 5), (33, 20, 27, 27), (8, 6, 1, 83),
              (20, 9, 3, 37), (130, 31, 28, 28), (128, 26, 5, 13), (140, 37, 2, 5),
              (129, 30, 3, 37), (127, 31, 3, 37), (64, 16, 11, 11), (24, 11, 4, 33)]
    assert {m % pgemm.MR for _, m, _, _ in shapes} == set(range(pgemm.MR))
    assert pgemm.TAIL_ROWS == 4
    for dtype in (np.float32, np.float64):
        lanes = 64 // np.dtype(dtype).itemsize
        nr = pgemm.NV * lanes
        for c, m, h, wd in shapes:
            p_ = h * wd
            x = RNG.standard_normal((1, c, h, wd)).astype(dtype)
            w = RNG.standard_normal((m, c, 1, 1)).astype(dtype)
            bias = RNG.standard_normal(m).astype(dtype)
            res = RNG.standard_normal(m * p_).astype(dtype)
            ap = np.empty(pgemm.packed_rows_size(m, c), dtype)
            pgemm.pack_a(np.ascontiguousarray(w.reshape(m, c)), ap)
            none = e.astype(dtype)
            for b, r, lo, hi in [(none, none, -INF, INF), (bias, res, -0.5, 6.0)]:
                y = np.full((1, m, h, wd), np.nan, dtype)
                pgemm.pointwise_rows(x, ap, y, 0, 1, b, lo, hi, r)
                np.testing.assert_allclose(y, _oracle(x, w, b, r, lo, hi), rtol=1e-4,
                                           atol=1e-4)
                if p_ > nr and dtype == np.float32:  # (two ranges, the first of whole
                    parts = np.full((1, m, h, wd), np.nan, dtype)  # panels: the same bits)
                    bounds = np.array([0, nr, p_], np.int64)
                    pgemm.rows_by_pixels(x, ap, parts, bounds, b, lo, hi, r)
                    assert np.array_equal(parts, y)
        assert (28 * 28) % (pgemm.NV * 16) == 16  # (the case this is for, in float32)
    # (the channels above straddle the packing's thresholds)
    assert -(-20 // pgemm.MR) < pgemm.PACK_MIN_TILES <= -(-26 // pgemm.MR)
    assert 127 < pgemm.PACK_MIN_CHANNELS <= 128
    assert -(-31 // pgemm.MR) <= pgemm.PANEL_MAX_TILES < -(-37 // pgemm.MR)


def _net(x, res_in):
    y = fluid.layers.conv2d(x, 22, 1, param_attr=fluid.ParamAttr(name="pw_w"),
                            bias_attr=fluid.ParamAttr(name="pw_b"))
    return fluid.layers.relu(fluid.layers.elementwise_add(y, res_in))


def test_the_kernel_is_picked_once_per_filter_and_call(monkeypatch):
    """``pointwise_weight`` decides the kernel from the filter's shape once per filter and
    call: later calls ask nothing of the shape, the packed copy is still the one kept beside
    the filter (made again after a write); another array, even one at an address a gone
    filter had, is picked for itself; the switch off packs nothing."""
    w = RNG.standard_normal((64, 32, 1, 1)).astype(np.float32)
    first = pointwise.pointwise_weight(w, 196)
    assert first.size > 0
    asked = []
    real = pointwise._kind
    monkeypatch.setattr(pointwise, "_kind", lambda *a: asked.append(a) or real(*a))
    assert pointwise.pointwise_weight(w, 196) is first and asked == []
    params.written([w])
    again = pointwise.pointwise_weight(w, 196)
    assert again is not first and np.array_equal(again, first) and asked == []
    pointwise.pointwise_weight(w, 64)  # another plane: picked for it
    assert len(asked) == 1
    narrow = RNG.standard_normal((8, 32, 1, 1)).astype(np.float32)  # too few channels
    assert pointwise.pointwise_weight(narrow, 196).size == 0
    # a pick kept for an array that is gone, at the address of this one: not this one's
    other = RNG.standard_normal((64, 32, 1, 1)).astype(np.float32)
    gone = np.empty(0, np.float32)
    pointwise._PICKS[(id(other), 196, 1, True, 0, 0)] = (weakref.ref(gone), 0, False)
    del gone
    assert pointwise.pointwise_weight(other, 196).size > 0
    monkeypatch.setattr(pointwise, "_PACKED", [False])
    assert pointwise.pointwise_weight(w, 196).size == 0


def test_program_on_the_packed_filter_and_training(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [19, 9, 11])
    r = fluid.layers.data("r", [22, 9, 11])
    out = _net(x, r)
    with fluid.program_guard(train := fluid.Program(), tstart := fluid.Program()):
        tx = fluid.layers.data("x", [19, 9, 11])
        tr = fluid.layers.data("r", [22, 9, 11])
        loss = fluid.layers.mean(_net(tx, tr))
        fluid.optimizer.SGD(learning_rate=5.0).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.global_scope()
    exe.run(tstart)

    def want(xv, rv):
        w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("pw_w", "pw_b"))
        return _oracle(xv, w, b, rv.ravel(), 0.0, INF)

    for batch in (1, 3):
        xv = RNG.standard_normal((batch, 19, 9, 11)).astype(np.float32)
        rv = RNG.standard_normal((batch, 22, 9, 11)).astype(np.float32)
        got, = exe.run(main, feed={"x": xv, "r": rv}, fetch_list=[out])
        assert_native(exe)
        np.testing.assert_allclose(got, want(xv, rv), rtol=1e-4, atol=1e-4)
    report = exe.explain(main, feed={"x": xv, "r": rv}, fetch_list=[out])
    assert "_nn.pointwise_range" in report, report
    wid = id(scope.find_var("pw_w").value)
    assert any(k[0] == wid for k in params._DERIVED)            # packed beside the filter
    before = np.asarray(scope.find_var("pw_w").get_tensor()).copy()
    exe.run(train, feed={"x": xv, "r": rv}, fetch_list=[loss])  # writes pw_w in place
    assert not np.array_equal(before, np.asarray(scope.find_var("pw_w").get_tensor()))
    assert not any(k[0] == wid for k in params._DERIVED)
    got, = exe.run(main, feed={"x": xv, "r": rv}, fetch_list=[out])
    np.testing.assert_allclose(got, want(xv, rv), rtol=1e-4, atol=1e-4)
    # the fetched filter is the filter as it is
    got_w, = exe.run(main, feed={"x": xv, "r": rv}, fetch_list=["pw_w"])
    assert got_w.shape == (22, 19, 1, 1)


def test_compiled_code_packs_at_each_run():
    """In compiled code (a native driver, an ahead-of-time artifact) the filter is packed at
    each run, for every block of samples: both orientations, and a batch too small for the
    copy, on the taps kernel."""
    @caller
    def call(x, w, y, bias, res):
        ap = pointwise.pointwise_weight(w, x.shape[2] * x.shape[3], x.shape[0])
        h = x.shape[0] // 2
        pointwise.pointwise_range(x, w, ap, y, 0, h, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, 6.0, res)
        pointwise.pointwise_range(x, w, ap, y, h, x.shape[0], 1, 1, 0, 0, 1, 1, 1, bias, 0.0,
                                  6.0, res)
        return ap.size

    bias = RNG.standard_normal(17).astype(np.float32)
    for n, h, packed in [(1, 48, True), (12, 7, True), (1, 7, False)]:  # rows, cols, neither
        x = RNG.standard_normal((n, 16, h, h)).astype(np.float32)
        w = RNG.standard_normal((17, 16, 1, 1)).astype(np.float32)
        res = RNG.standard_normal(n * 17 * h * h).astype(np.float32)
        y = np.full((n, 17, h, h), np.nan, np.float32)
        assert (call(x, w, y, bias, res) > 0) == packed
        np.testing.assert_allclose(y, _oracle(x, w, bias, res, 0.0, 6.0), rtol=1e-4,
                                   atol=1e-4)


def test_split_work_parts_by_channels(monkeypatch, blas_same):
    """``conv.split_work`` splits a one-sample call over whole tiles of the packed filter's
    output channels dealt out evenly (row tiles of ``MR``: 25 tiles, the last short, in
    parts of 8, 8 and 9; transposed tiles: panels of 48 or 64 channels, the last part at
    least ``MIN_CHANNELS``), over
    ``conv._fwd_range``'s parts where nothing is packed, and runs it whole where there is one
    part; on ``run_parts``' helpers, then by a parallel loop; every result is
    the one call's bit for bit (by BLAS: where it sums the parts as the whole)."""
    from pdjit.codegen.cpu.lib import conv, team

    monkeypatch.setattr(conv, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(conv, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(conv, "loop_threads", lambda: 3)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    e = np.empty(0, np.float32)
    seen = []
    # (the row tiles' split by pixels, which a loop made ready elsewhere would take first:
    # the test below)
    monkeypatch.setattr(pointwise, "_pixel_bounds", lambda parts, p_: None)
    for mod, name in ((pointwise, "_tile_bounds"), (conv, "_channel_bounds")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: seen.append(
            (name, real(*a))) or seen[-1][1])
    # (C, M, H, packed, the parts' channels)
    for c, m, h, packed, want in [(19, 149, 32, True, [48, 48, 53]),
                                  (40, 140, 7, True, [48, 48, 44]),
                                  (40, 128, 6, True, [64, 64]),
                                  (40, 70, 7, False, [32, 38]),
                                  (40, 17, 7, True, None), (40, 40, 7, False, None)]:
        x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
        w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        res = RNG.standard_normal(m * h * h).astype(np.float32)
        ap = pointwise.pointwise_weight(w, h * h) if packed else e
        assert (ap.size > 0) == packed
        one = np.full((1, m, h, h), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, one, 0, 1, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, 6.0, res)
        np.testing.assert_allclose(one, _oracle(x, w, bias, res, 0.0, 6.0), rtol=1e-4,
                                   atol=1e-4)
        for here in (False, True):  # on the helpers, then by the loop (compiled if need be)
            monkeypatch.setattr(team, "COMPILE", here)
            y = np.full((1, m, h, h), np.nan, np.float32)
            seen.clear()
            conv.split_work(pointwise.pointwise_range, 1, 1, x, w, ap, y, 1, 1, 0, 0, 1, 1, 1,
                            bias, 0.0, 6.0, res, head=4)
            name, found = seen[-1]
            assert name == ("_tile_bounds" if packed else "_channel_bounds")
            bounds = found and (found[0] if packed else found)
            assert (bounds and list(np.diff(bounds))) == want
            if packed:
                assert np.array_equal(y, one)
            else:  # (the parts by BLAS)
                blas_same(y, one)


def test_row_tiles_split_by_pixels(monkeypatch):
    """A one-sample call on the row tiles splits by ranges of whole panels of pixels (the
    last range taking what is left: planes that are no multiple of ``NR``), by a parallel
    loop: each part computes every output channel of its pixels, the one call's bits; a
    plane of one panel is not split."""
    from pdjit.codegen.cpu.lib import conv, team

    monkeypatch.setattr(conv, "loop_threads", lambda: 3)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "_READY", {})   # (the loops made ready here stay here)
    calls = []
    real = pgemm.rows_by_pixels
    real_run = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: calls.append(
        (loop, call[3].tolist() if loop is real else None)) or real_run(loop, call))
    nr = pgemm.panel_width(np.float32)
    # (C, M, H, the ranges' pixels or None: not split by pixels)
    for c, m, h, want in [(16, 96, 40, [512, 512, 576]), (24, 20, 23, [192, 192, 145]),
                          (32, 16, 24, [192, 192, 192]), (16, 48, 8, None)]:
        if want is not None:
            assert pointwise._choice(m, c, h * h) == 1
        x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
        w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        res = RNG.standard_normal(m * h * h).astype(np.float32)
        ap = pointwise.pointwise_weight(w, h * h)
        if not ap.size:
            assert want is None
            continue
        one = np.full((1, m, h, h), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, one, 0, 1, 1, 1, 0, 0, 1, 1, 1, bias, -1.0, 6.0, res)
        np.testing.assert_allclose(one, _oracle(x, w, bias, res, -1.0, 6.0), rtol=1e-4,
                                   atol=1e-4)
        y = np.full((1, m, h, h), np.nan, np.float32)
        calls.clear()
        conv.split_work(pointwise.pointwise_range, 1, 1 << 30, x, w, ap, y, 1, 1, 0, 0, 1, 1,
                        1, bias, -1.0, 6.0, res, head=4)
        got = [b for loop, b in calls if loop is real]
        if want is None:
            assert got == []
        else:
            assert got and list(np.diff(got[0])) == want and all(b % nr == 0 for b in got[0][:-1])
        assert np.array_equal(y, one)


def test_subsample_against_numpy_slicing():
    from pdjit.codegen.cpu.lib import conv

    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    for sh, sw in [(2, 2), (2, 1), (3, 2), (1, 3)]:
        want = x[:, :, ::sh, ::sw]
        got = np.full(want.shape, np.nan, np.float32)
        conv.subsample(x, sh, sw, got)
        assert np.array_equal(got, want)
    import pytest
    with pytest.raises(ValueError, match="subsample"):
        conv.subsample(x, 2, 2, np.empty((2, 3, 6, 4), np.float32))  # row 10 of 9
    with pytest.raises(ValueError, match="subsample"):
        conv.subsample(x, 2, 2, np.empty((2, 4, 5, 4), np.float32))  # channels


def test_uneven_panels_split_by_channels_instead(monkeypatch, team_loops):
    """On two threads a 13x13 plane's three panels (the last of 41 pixels) would split 1 : 2
    by pixels: the call splits by tiles of output channels instead (``_by_channels``), and a
    28x28 plane (13 panels) still by pixels; the one call's bits, NumPy's values."""
    from pdjit.codegen.cpu.lib import conv

    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    for h, loop in [(13, pointwise._by_channels), (28, pgemm.rows_by_pixels)]:
        c, m = 64, 96
        assert pointwise._choice(m, c, h * h) == 1
        x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
        w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        none = np.empty(0, np.float32)
        ap = pointwise.pointwise_weight(w, h * h)
        one = np.full((1, m, h, h), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, one, 0, 1, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, np.inf,
                                  none)
        np.testing.assert_allclose(one, _oracle(x, w, bias, none, 0.0, np.inf), rtol=1e-4,
                                   atol=1e-4)
        y = np.full((1, m, h, h), np.nan, np.float32)
        team_loops.clear()
        conv.split_work(pointwise.pointwise_range, 1, 1 << 30, x, w, ap, y, 1, 1, 0, 0, 1, 1,
                        1, bias, 0.0, np.inf, none, head=4)
        assert [(f, ran) for f, _, ran in team_loops] == [(loop, True)]
        assert np.array_equal(y, one)


def test_subsample_split_over_the_team_as_one_thread(monkeypatch, team_loops):
    """A copy large enough for the parallel loops' threads, split by rows there (the loop
    made ready at once): the same values as NumPy's slicing, and the loop ran."""
    from pdjit.codegen.cpu.lib import conv

    x = RNG.standard_normal((1, 90, 57, 55)).astype(np.float32)  # (90 * 29 rows, odd sizes)
    want = x[:, :, ::2, ::2]
    assert want.size >= conv.SUBSAMPLE_TEAM_MIN
    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    got = np.full(want.shape, np.nan, np.float32)
    conv.subsample(x, 2, 2, got)
    assert team_loops == [(conv._subsample_by_team, 2, True)]
    assert np.array_equal(got, want)


def test_strided_1x1_runs_on_the_row_tiles_of_its_subsample(fresh_programs):
    """A 1x1 stride-2 convolution (a ResNet shortcut) whose output plane the row tiles take:
    the image's subsample, then the stride-1 kernel on the packed filter, its bias, residual
    and relu as it stores; odd planes (31x32 -> 16x16), against NumPy, in native code."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [64, 31, 32])
    r = fluid.layers.data("r", [128, 16, 16])
    y = fluid.layers.conv2d(x, 128, 1, stride=2, param_attr=fluid.ParamAttr(name="sw_w"),
                            bias_attr=fluid.ParamAttr(name="sw_b"))
    out = fluid.layers.relu(fluid.layers.elementwise_add(y, r))
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    scope = fluid.global_scope()
    w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("sw_w", "sw_b"))
    for batch in (1, 3):
        xv = RNG.standard_normal((batch, 64, 31, 32)).astype(np.float32)
        rv = RNG.standard_normal((batch, 128, 16, 16)).astype(np.float32)
        got, = exe.run(main, feed={"x": xv, "r": rv}, fetch_list=[out])
        assert_native(exe)
        want = _oracle(np.ascontiguousarray(xv[:, :, ::2, ::2]), w, b, rv.ravel(), 0.0, INF)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    report = exe.explain(main, feed={"x": xv, "r": rv}, fetch_list=[out])
    assert "_nn.conv.subsample(" in report and "_nn.pointwise_range_rows" in report, report
