"""Convolutions onto small planes on the packed GEMM's transposed tiles over each sample's
patches (``pdjit.codegen.cpu.lib.pointwise.conv_cols``): 3x3, 5x5, strided, padded, dilated
and 1x1 strided filters, both tile shapes (panels of 48 and 64 output channels), sums long
enough to be taken by chunks, a residual in the output's own buffer, against a NumPy oracle
written here; split over threads bit for bit; in compiled code; the taps kernel until the
kernel is ready; and in a program, where a 3x3 stride-1 filter goes to Winograd's kernel at
larger batches."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu.lib import pgemm, pointwise, team, winograd
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing import assert_native

RNG = np.random.default_rng(57)
INF = np.inf


@pytest.fixture
def ready(monkeypatch):
    """The kernel compiled at its first ask (as warmup compiles it ahead)."""
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)


def _oracle(x, w, sh, sw, pt, pl, dh, dw, oh, ow, bias, res, lo, hi):
    """The convolution in float64, tap by tap (zero padding before and after as needed)."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    big = np.zeros((n, c, h + 2 * pt + kh * dh + oh * sh, wd + 2 * pl + kw * dw + ow * sw))
    big[:, :, pt:pt + h, pl:pl + wd] = x
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = big[:, :, i * dh:i * dh + oh * sh:sh, j * dw:j * dw + ow * sw:sw]
            y += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j].astype(np.float64))
    if bias.size:
        y += bias.astype(np.float64)[None, :, None, None]
    if res.size:
        y += res.reshape(y.shape)
    return np.minimum(np.maximum(y, lo), hi)


def _out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _in_place_and_range(x, w, ap, geo, bias, res):
    """``pointwise_range`` with the residual in the output's own buffer (the memory plan's in
    place), and, for a batch, on a range of samples that leaves the others alone, against the
    oracle (``geo``: the call's stride, padding, dilation and groups, each axis alike)."""
    n, m = x.shape[0], w.shape[0]
    s, _, p, _, d, _, _ = geo
    oh = _out(x.shape[2], w.shape[2], s, p, d)
    ow = _out(x.shape[3], w.shape[3], s, p, d)
    e = np.empty(0, np.float32)
    y = res.reshape(n, m, oh, ow).copy()
    pointwise.pointwise_range(x, w, ap, y, 0, n, *geo, bias, 0.0, 1.5, y.reshape(-1))
    np.testing.assert_allclose(y, _oracle(x, w, s, s, p, p, d, d, oh, ow, bias, res, 0.0, 1.5),
                               rtol=1e-4, atol=1e-4)
    if n > 1:
        y = np.full((n, m, oh, ow), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, y, 1, 2, *geo, bias, 0.0, INF, e)
        np.testing.assert_allclose(y[1], _oracle(x, w, s, s, p, p, d, d, oh, ow, bias, e,
                                                 0.0, INF)[1], rtol=1e-4, atol=1e-4)
        assert np.isnan(y[0]).all()



def _team_loops(monkeypatch) -> list:
    """Every one-sample call splits over a parallel loop of three parts (the thresholds off):
    the list each loop that ran is appended to, ``(loop, its arguments)``."""
    from pdjit.codegen.cpu.lib import conv

    monkeypatch.setattr(conv, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(conv, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(conv, "loop_threads", lambda: 3)
    loops = []
    real_run = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: real_run(loop, call) and
                        not loops.append((loop, call)))
    return loops


def _split_by_rows(x, w, ap, geo, bias, res, one, loops, loop) -> list:
    """A one-sample ``pointwise_range`` through ``split_work`` (``loops``: :func:`_team_loops`'),
    its residual in another buffer, then in the output's own: each split by the parallel loop
    ``loop`` alone, with ``one``'s bits (the call unsplit); the row bounds of each."""
    from pdjit.codegen.cpu.lib import conv

    bounds = []
    for in_place in (False, True):
        y = res.reshape(one.shape).copy() if in_place else np.full(one.shape, np.nan,
                                                                    np.float32)
        loops.clear()
        conv.split_work(pointwise.pointwise_range, 1, 1, x, w, ap, y, *geo, bias, 0.0, 6.0,
                        y.reshape(-1) if in_place else res, head=4)
        assert [lp for lp, _ in loops] == [loop]
        bounds.append(loops[0][1][3])
        assert np.array_equal(y, one)
    return bounds

# (batch, C, M, H, W, k, stride, pad, dilation, the tile kind)
CASES = [(1, 40, 130, 7, 7, 3, 1, 1, 1, 3),      # ResNet-like 7x7, panels of 48
         (2, 24, 128, 14, 12, 3, 2, 1, 1, 2),    # stride 2 onto 7x6: panels of 64
         (1, 64, 96, 14, 14, 1, 2, 0, 1, 3),     # a 1x1 stride-2 shortcut
         (1, 20, 96, 9, 9, 5, 1, 2, 1, 3),       # 5x5 onto 9x9
         (1, 17, 64, 9, 8, 3, 1, 1, 2, 2),       # dilated onto 7x6
         (1, 160, 96, 7, 7, 3, 1, 1, 1, 3),      # 1440 products: by chunks of the panels
         (1, 64, 128, 28, 28, 3, 2, 1, 1, 2)]    # 14x14, 576 products onto whole panels


@pytest.mark.parametrize("n,c,m,h,wd,k,s,p,d,kind", CASES)
def test_patches_against_numpy(n, c, m, h, wd, k, s, p, d, kind, ready, monkeypatch):
    monkeypatch.setattr(pointwise, "_taps_pays", lambda *a: 0)  # (the patches, not the taps)
    oh, ow = _out(h, k, s, p, d), _out(wd, k, s, p, d)
    assert pointwise._kind(m, c * k * k, oh * ow, False) == kind
    if c == 160:
        assert c * k * k * pointwise._step(kind) * 4 > pointwise.CHUNK_BYTES
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = (RNG.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(n * m * oh * ow).astype(np.float32)
    e = np.empty(0, np.float32)
    ap = pointwise.pointwise_weight(w, oh * ow, n, False)
    assert ap.size == -(-m // pointwise._step(kind)) * pointwise._step(kind) * c * k * k
    geo = (s, s, p, p, d, d, 1)
    for b, r, lo, hi in [(e, e, -INF, INF), (bias, e, 0.0, INF), (e, res, -INF, INF),
                         (bias, res, 0.0, 1.5)]:
        y = np.full((n, m, oh, ow), np.nan, np.float32)
        pointwise.pointwise_range(x, w, ap, y, 0, n, *geo, b, lo, hi, r)
        want = _oracle(x, w, s, s, p, p, d, d, oh, ow, b, r, lo, hi)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    _in_place_and_range(x, w, ap, geo, bias, res)


def test_padding_only_before_or_after(ready, monkeypatch):
    """Top and left paddings are arguments, the bottom and right ones follow from the output's
    size (Paddle's four paddings: here 0 above, 1 below, 2 left, 0 right), against NumPy."""
    monkeypatch.setattr(pointwise, "_taps_pays", lambda *a: 0)  # (the patches, not the taps)
    x = RNG.standard_normal((1, 24, 8, 7)).astype(np.float32)
    w = RNG.standard_normal((96, 24, 3, 3)).astype(np.float32)
    e = np.empty(0, np.float32)
    oh, ow = 8 + 0 + 1 - 2, 7 + 2 + 0 - 2
    ap = pointwise.pointwise_weight(w, oh * ow, 1, False)
    assert ap.size > 0
    y = np.full((1, 96, oh, ow), np.nan, np.float32)
    pointwise.pointwise_range(x, w, ap, y, 0, 1, 1, 1, 0, 2, 1, 1, 1, e, -INF, INF, e)
    np.testing.assert_allclose(y, _oracle(x, w, 1, 1, 0, 2, 1, 1, oh, ow, e, e, -INF, INF),
                               rtol=1e-4, atol=1e-4)


def test_where_the_taps_kernel_stays(ready, monkeypatch):
    """Panels mostly empty or planes that fill the taps kernel's vectors: nothing packed (the
    taps kernel serves); large planes and several groups never take the transposed tiles;
    nor does any until the kernel is ready (the results the taps kernel's)."""
    w = RNG.standard_normal((32, 128, 3, 3)).astype(np.float32)
    assert pointwise.pointwise_weight(w, 49, 1, False).size == 0       # 32 of 48 channels
    w = RNG.standard_normal((48, 96, 5, 5)).astype(np.float32)
    assert pointwise.pointwise_weight(w, 64, 1, False).size == 0       # 8x8: whole vectors
    assert pointwise._kind(96, 4608, 196, False) == 0                  # 14x14, 1.5 panels
    assert pointwise._kind(128, 288, 196, False) == 0                  # ... short sums
    assert pointwise.usable(64, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2, p=49, q=49) == ""  # groups
    assert pointwise.usable(64, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, p=196, q=49) == \
        "pointwise_range_patches"
    assert pointwise.usable(64, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, p=49, q=49) == \
        "pointwise_range_patches_3x3"
    w = RNG.standard_normal((96, 16, 3, 3)).astype(np.float32)
    assert pointwise.pointwise_weight(w, 49, 1, False).size > 0
    monkeypatch.setattr(pointwise, "_patches_ready", lambda: False)
    assert pointwise.pointwise_weight(w, 49, 1, False).size == 0
    x = RNG.standard_normal((1, 16, 7, 7)).astype(np.float32)
    y = np.full((1, 96, 7, 7), np.nan, np.float32)
    e = np.empty(0, np.float32)
    pointwise.pointwise_range(x, w, e, y, 0, 1, 1, 1, 1, 1, 1, 1, 1, e, -INF, INF, e)
    np.testing.assert_allclose(y, _oracle(x, w, 1, 1, 1, 1, 1, 1, 7, 7, e, e, -INF, INF),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,h,s,shared", [(24, 14, 2, True), (25, 14, 2, True),
                                          (25, 7, 1, False)])
def test_split_over_threads_gives_the_one_calls_bits(ready, monkeypatch, c, h, s, shared):
    """A one-sample call split by panels of output channels, on ``run_parts``' helpers and by
    a parallel loop: each part builds the patches, or, where they are not much larger than
    the image (stride 2), the parts build them together, each its share of the input
    channels (25 in three unequal shares), then each computes its output channels. The one
    call's bits; a residual in the output's own buffer too. (The split by output rows, which
    the loop takes for these filters, switched off: see the test after.)"""
    from pdjit.codegen.cpu.lib import conv

    monkeypatch.setattr(pointwise, "COLS_BY_ROWS", False)
    # (the patches: 144 channels of 7-pixel rows would read their taps)
    monkeypatch.setattr(pointwise, "_taps_pays", lambda *a: 0)
    monkeypatch.setattr(conv, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(conv, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(conv, "loop_threads", lambda: 3)
    seen, loops = [], []
    real = pointwise._tile_bounds
    monkeypatch.setattr(pointwise, "_tile_bounds",
                        lambda *a: seen.append(real(*a)) or seen[-1])
    real_run = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: real_run(loop, call) and
                        not loops.append(loop))
    x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
    w = RNG.standard_normal((144, c, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(144).astype(np.float32)
    res = RNG.standard_normal(144 * 49).astype(np.float32)
    ap = pointwise.pointwise_weight(w, 49, 1, False)
    geo = (s, s, 1, 1, 1, 1, 1)
    one = np.full((1, 144, 7, 7), np.nan, np.float32)
    pointwise.pointwise_range(x, w, ap, one, 0, 1, *geo, bias, 0.0, 6.0, res)
    np.testing.assert_allclose(one, _oracle(x, w, s, s, 1, 1, 1, 1, 7, 7, bias, res, 0.0, 6.0),
                               rtol=1e-4, atol=1e-4)
    for here in (False, True):  # on the helpers, then by the loop (compiled if need be)
        monkeypatch.setattr(team, "COMPILE", here)
        for in_place in (False, True):
            y = res.reshape(one.shape).copy() if in_place else \
                np.full((1, 144, 7, 7), np.nan, np.float32)
            seen.clear()
            loops.clear()
            conv.split_work(pointwise.pointwise_range, 1, 1, x, w, ap, y, *geo, bias, 0.0, 6.0,
                            y.reshape(-1) if in_place else res, head=4)
            bounds, _, nr = seen[-1]
            assert nr == 48 and list(np.diff(bounds)) == [48, 48, 48]
            if here:  # (else the helpers, or the loop where an earlier test made it ready)
                assert loops == [pointwise._patches_by_channels if shared else
                                 pointwise._by_channels]
            assert np.array_equal(y, one)


@pytest.mark.parametrize("c,m,h,k,s,p", [(25, 140, 7, 3, 1, 1), (24, 130, 14, 3, 2, 1),
                                         (19, 96, 9, 5, 1, 2), (64, 64, 14, 3, 1, 1)])
def test_split_by_output_rows_gives_the_one_calls_bits(ready, monkeypatch, c, m, h, k, s, p):
    """A one-sample call on the patches of a filter wider than 1x1 split by a parallel loop
    into ranges of its output rows (7 rows in three parts of 2, 2 and 3; 14 in 4, 5, 5), each
    part building the patches of its rows alone and computing every output channel of them:
    the one call's bits, its residual in another buffer and in the output's own; a 1x1 filter
    (its patches a quarter of the image at stride 2) keeps the split by output channels."""
    from pdjit.codegen.cpu.lib import conv

    loops = _team_loops(monkeypatch)
    x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
    w = RNG.standard_normal((m, c, k, k)).astype(np.float32)
    oh = _out(h, k, s, p, 1)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(m * oh * oh).astype(np.float32)
    ap = pointwise.pointwise_weight(w, oh * oh, 1, False)
    assert ap.size
    geo = (s, s, p, p, 1, 1, 1)
    one = np.full((1, m, oh, oh), np.nan, np.float32)
    pointwise.pointwise_range(x, w, ap, one, 0, 1, *geo, bias, 0.0, 6.0, res)
    np.testing.assert_allclose(one, _oracle(x, w, s, s, p, p, 1, 1, oh, oh, bias, res, 0.0,
                                            6.0), rtol=1e-4, atol=1e-4)
    for rows in _split_by_rows(x, w, ap, geo, bias, res, one, loops,
                               pointwise._cols_by_rows):
        assert rows[0] == 0 and rows[-1] == oh and len(rows) == 4 and \
            np.diff(rows).max() - np.diff(rows).min() <= 1
    w1 = RNG.standard_normal((m, 4 * c, 1, 1)).astype(np.float32)
    x1 = RNG.standard_normal((1, 4 * c, 2 * oh, 2 * oh)).astype(np.float32)
    ap1 = pointwise.pointwise_weight(w1, oh * oh, 1, False)
    y1 = np.empty_like(one)
    loops.clear()
    conv.split_work(pointwise.pointwise_range, 1, 1, x1, w1, ap1, y1, 2, 2, 0, 0, 1, 1, 1,
                    bias, 0.0, 6.0, res, head=4)
    assert pointwise._cols_by_rows not in [lp for lp, _ in loops]
    np.testing.assert_allclose(y1, _oracle(x1, w1, 2, 2, 0, 0, 1, 1, oh, oh, bias, res, 0.0,
                                           6.0), rtol=1e-4, atol=1e-4)


def test_compiled_code_packs_at_each_run():
    """In compiled code the filter is packed at each run where the batch is large enough
    (``pgemm.pack_rows``, the layout of the host's ``_pack``), else the taps kernel serves."""
    @caller
    def call(x, w, y, bias):
        oh, ow = y.shape[2], y.shape[3]
        ap = pointwise.pointwise_weight(w, oh * ow, x.shape[0], False, 0)
        pointwise.pointwise_range(x, w, ap, y, 0, x.shape[0], 2, 2, 1, 1, 1, 1, 1, bias, 0.0,
                                  INF, bias[:0])
        return ap.size

    w = RNG.standard_normal((96, 16, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(96).astype(np.float32)
    e = np.empty(0, np.float32)
    for n, packed in [(12, True), (1, False)]:
        x = RNG.standard_normal((n, 16, 13, 13)).astype(np.float32)
        y = np.full((n, 96, 7, 7), np.nan, np.float32)
        assert (call(x, w, y, bias) > 0) == packed
        np.testing.assert_allclose(y, _oracle(x, w, 2, 2, 1, 1, 1, 1, 7, 7, bias, e, 0.0, INF),
                                   rtol=1e-4, atol=1e-4)
    host = pointwise.pointwise_weight(w, 49, 12, False)
    native = np.empty_like(host)
    pgemm.pack_rows(w.reshape(96, -1), pointwise._step(3), native)  # (its Python)
    assert np.array_equal(host, native)


def test_program_takes_them_and_winograd_at_larger_batches(fresh_programs, ready,
                                                            monkeypatch):
    """A 3x3 stride-1 convolution onto a 7x7 plane (16 tiles of Winograd's kernel a sample)
    runs on the transposed tiles at batch 1 and on Winograd's kernel from the batch at which
    that takes it (nothing packed); a stride-2 one onto the same plane always on the
    transposed tiles. A filter whose transform stays in the L2 cache takes Winograd's kernel
    from 16 tiles: at batch 1."""
    main, _ = fresh_programs
    x = fluid.layers.data("x", [32, 14, 14])
    a = fluid.layers.conv2d(x, 64, 3, stride=2, padding=1, act="relu",
                            param_attr=fluid.ParamAttr(name="wa"), bias_attr=False)
    b = fluid.layers.conv2d(a, 256, 3, padding=1, param_attr=fluid.ParamAttr(name="wb"),
                            bias_attr=False, act="relu")
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.global_scope()
    for name, shape in (("wa", (64, 32, 3, 3)), ("wb", (256, 64, 3, 3))):
        scope.var(name).get_tensor().set(
            (RNG.standard_normal(shape) / 12).astype(np.float32), fluid.CPUPlace())
    wa, wb = (np.asarray(scope.find_var(n).get_tensor()) for n in ("wa", "wb"))
    wino = []
    real = winograd.conv3x3
    monkeypatch.setattr(winograd, "conv3x3", lambda *a: wino.append(1) or real(*a))
    e = np.empty(0, np.float32)
    for batch, on_winograd in ((1, False), (3, True)):
        xv = RNG.standard_normal((batch, 32, 14, 14)).astype(np.float32)
        wino.clear()
        got, = exe.run(main, feed={"x": xv}, fetch_list=[b])
        assert_native(exe)
        mid = _oracle(xv, wa, 2, 2, 1, 1, 1, 1, 7, 7, e, e, 0.0, INF)
        np.testing.assert_allclose(got, _oracle(mid, wb, 1, 1, 1, 1, 1, 1, 7, 7, e, e, 0.0,
                                                INF), rtol=1e-3, atol=1e-3)
        assert bool(wino) == on_winograd
        assert (pointwise.pointwise_weight(wb, 49, batch, False, 16).size == 0) == on_winograd
    # 16 tiles: 256 x 64 filters transformed take 1 MiB, 96 x 64 ones 384 KiB
    assert not winograd.enough_tiles(16, 256, 64) and winograd.enough_tiles(16, 96, 64)
    assert winograd.enough_tiles(32, 256, 64) and not winograd.enough_tiles(15, 96, 64)
    small = wb[:96]
    assert pointwise.pointwise_weight(small, 49, 1, False, 16).size == 0
    assert pointwise.pointwise_weight(small, 49, 1, False, 0).size > 0  # (no Winograd: packed)
    report = exe.explain(main, feed={"x": xv}, fetch_list=[b])
    assert "_nn.pointwise_range_patches_3x3," in report
    assert "_nn.pointwise_range_patches," in report
