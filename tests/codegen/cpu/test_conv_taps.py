"""Convolutions on the packed GEMM's transposed tiles reading each step's tap in the padded
image (``pdjit.codegen.cpu.lib.pointwise.conv_taps``), where a filter wider than 1x1 fills
whole panels of output channels and the output rows are long (a network's first layer, the
stride-2 3x3 layers of a ResNet): against the NumPy oracle of ``test_conv_cols`` over
strides, paddings (also only before or after), dilations, odd sizes, few input channels, sums
long enough to be taken by chunks, a bias, residual (also in the output's own buffer) and
clamp; the bits of the same tiles over the patches; split by output rows over threads bit for
bit; in compiled code; and in a program."""
import numpy as np
import pytest
from test_conv_cols import (  # (NumPy, tap by tap)
    _in_place_and_range,
    _oracle,
    _out,
    _split_by_rows,
    _team_loops,
)

import pdjit as fluid
from pdjit.codegen.cpu.lib import pointwise, team
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing import assert_native

RNG = np.random.default_rng(71)
INF = np.inf
E = np.empty(0, np.float32)


@pytest.fixture
def ready(monkeypatch):
    """The kernels compiled at their first ask (as warmup compiles them ahead)."""
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)


@pytest.fixture
def counted(monkeypatch, ready):
    """The calls of ``conv_taps`` from the host's ``pointwise_range`` and of its split by rows
    over threads (the kernel ready)."""
    calls = []
    real, real_run = pointwise.conv_taps, team.run
    monkeypatch.setattr(pointwise, "_taps_ready", lambda: True)
    monkeypatch.setattr(pointwise, "conv_taps", lambda *a: calls.append(a[1:3]) or real(*a))
    monkeypatch.setattr(team, "run", lambda loop, call: real_run(loop, call) and (
        loop is not pointwise._taps_parts or not calls.append(loop)))
    return calls


# (batch, C, M, H, W, k, stride, pad, dilation)
CASES = [(1, 3, 64, 60, 61, 7, 2, 3, 1),      # a network's first layer (7x7/2, 3 channels)
         (2, 6, 64, 61, 58, 3, 2, 0, 1),      # ... 3x3/2 unpadded, odd sizes, two samples
         (1, 24, 128, 57, 57, 3, 2, 1, 1),    # a ResNet's stride-2 3x3 (rows of 29: 4 x 6 + 5)
         (1, 16, 64, 28, 30, 5, 1, 2, 1),     # 5x5 stride 1
         (1, 6, 64, 33, 40, 3, 1, 2, 2),      # dilated
         (1, 160, 64, 30, 30, 3, 1, 1, 1),    # 1440 products: the panel by chunks
         # tiles of 7 pixels by 48 channels (kind 3) onto rows of 7 or 14 pixels:
         (1, 40, 144, 7, 7, 3, 1, 1, 1),      # 3x3 onto 7x7, whole panels
         (1, 20, 200, 13, 14, 3, 2, 1, 1),    # stride 2 onto 7x7, the last panel part empty
         (2, 9, 96, 29, 27, 3, 2, 1, 1)]      # onto 15x14 planes, two samples


@pytest.mark.parametrize("n,c,m,h,wd,k,s,p,d", CASES)
def test_taps_against_numpy(n, c, m, h, wd, k, s, p, d, ready, counted):
    oh, ow = _out(h, k, s, p, d), _out(wd, k, s, p, d)
    kind = pointwise._taps_pays(m, c, k, k, ow)
    assert kind == (3 if ow < pointwise.TAPS_MIN_ROW else 2) and \
        pointwise._kind(m, c * k * k, oh * ow, False, kind) == kind
    nr = pointwise._step(kind)
    if c == 160:
        assert c * k * k * nr * 4 > pointwise.CHUNK_BYTES
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = (RNG.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(n * m * oh * ow).astype(np.float32)
    ap = pointwise.pointwise_weight(w, oh * ow, n, False, 0, ow)
    assert ap.size == -(-m // nr) * nr * c * k * k
    geo = (s, s, p, p, d, d, 1)
    for b, r, lo, hi in [(E, E, -INF, INF), (bias, E, 0.0, INF), (E, res, -INF, INF),
                         (bias, res, 0.0, 1.5)]:
        y = np.full((n, m, oh, ow), np.nan, np.float32)
        counted.clear()
        pointwise.pointwise_range(x, w, ap, y, 0, n, *geo, b, lo, hi, r)
        assert len(counted) == 1
        np.testing.assert_allclose(y, _oracle(x, w, s, s, p, p, d, d, oh, ow, b, r, lo, hi),
                                   rtol=1e-4, atol=1e-4)
        # the same tiles over the patches sum the same products in the same order
        z = np.full_like(y, np.nan)
        pointwise.conv_cols(x, ap, nr, z, 0, n, k, k, s, s, p, p, d, d, b, lo, hi, r)
        assert np.array_equal(y, z)
    _in_place_and_range(x, w, ap, geo, bias, res)


def test_padding_only_before_or_after(ready, counted):
    """Top and left paddings are arguments, the bottom and right ones follow from the output's
    size (here 0 above, 2 below, 3 left, 0 right), against NumPy."""
    x = RNG.standard_normal((1, 8, 40, 31)).astype(np.float32)
    w = RNG.standard_normal((64, 8, 3, 3)).astype(np.float32)
    oh, ow = (40 + 0 + 2 - 3) // 1 + 1, (31 + 3 + 0 - 3) // 1 + 1
    ap = pointwise.pointwise_weight(w, oh * ow, 1, False, 0, ow)
    y = np.full((1, 64, oh, ow), np.nan, np.float32)
    pointwise.pointwise_range(x, w, ap, y, 0, 1, 1, 1, 0, 3, 1, 1, 1, E, -INF, INF, E)
    assert len(counted) == 1
    np.testing.assert_allclose(y, _oracle(x, w, 1, 1, 0, 3, 1, 1, oh, ow, E, E, -INF, INF),
                               rtol=1e-4, atol=1e-4)


def test_where_the_taps_pay(ready, monkeypatch):
    """Whole panels of output channels over rows of 28 pixels or more: a first layer of 3
    input channels included (which the other packed kernels leave), but not sums of fewer
    than 48 products (a 3x3 filter on 3 channels); not 96 channels (a
    quarter of two panels empty), 128 channels onto rows of 14 (the patches; tiles of 7 pixels
    by 48 channels take 96, 200 or 512 there), a 1x1 filter (strided:
    the subsample or the patches), nor any until the kernel is ready (the taps kernel then
    serves, the same results)."""
    assert pointwise.usable(64, 3, 7, 7, 2, 2, 3, 3, 1, 1, 1, p=224 * 224, q=112 * 112,
                            ow=112) == "pointwise_range_patches"
    assert pointwise.usable(64, 3, 7, 7, 2, 2, 3, 3, 1, 1, 1, p=224 * 224,
                            q=112 * 112) == ""                      # (rows unknown)
    assert pointwise.usable(96, 3, 7, 7, 2, 2, 0, 0, 1, 1, 1, p=224 * 224, q=109 * 109,
                            ow=109) == ""
    # sums of fewer than TAPS_MIN_K products (a 3x3 filter on 3 channels: 27) are left to
    # the taps kernel of conv._fwd_range
    assert pointwise.usable(64, 3, 3, 3, 2, 2, 0, 0, 1, 1, 1, p=224 * 224, q=111 * 111,
                            ow=111) == ""
    assert [pointwise._taps_pays(64, c, 3, 3, 111) for c in (3, 5, 6, 16)] == [0, 0, 2, 2]
    assert not pointwise._taps_pays(128, 8, 3, 3, 14) and pointwise._taps_pays(128, 8, 3, 3, 28)
    assert not pointwise._taps_pays(512, 64, 1, 1, 28)
    # rows of 7 or 14 pixels on tiles of 7 by 48 channels: whole panels, or enough of them
    assert [pointwise._taps_pays(m, 8, 3, 3, ow) for m, ow in (
        (96, 7), (512, 14), (200, 7), (128, 7), (512, 15), (512, 0), (512, 21), (192, 14),
        (190, 7))] == [3, 3, 3, 0, 0, 0, 3, 0, 0]
    # (192 channels pack to one size in panels of 48 and of 64: a filter packed for the patches
    # of a plane whose rows were not given must not be taken for the taps' kind)
    w = RNG.standard_normal((192, 16, 3, 3)).astype(np.float32)
    x = RNG.standard_normal((1, 16, 14, 14)).astype(np.float32)
    y = np.full((1, 192, 14, 14), np.nan, np.float32)
    pointwise.pointwise_range(x, w, pointwise.pointwise_weight(w, 196, 1, False), y, 0, 1, 1,
                              1, 1, 1, 1, 1, 1, E, -INF, INF, E)
    np.testing.assert_allclose(y, _oracle(x, w, 1, 1, 1, 1, 1, 1, 14, 14, E, E, -INF, INF),
                               rtol=1e-4, atol=1e-4)
    assert pointwise.usable(128, 256, 3, 3, 2, 2, 1, 1, 1, 1, 1, p=784, q=196, ow=14) == \
        "pointwise_range_patches"                          # (the patches: 128 channels)
    w = RNG.standard_normal((64, 3, 7, 7)).astype(np.float32)
    assert pointwise.pointwise_weight(w, 900, 1, False, 0, 30).size == 64 * 147
    assert pointwise.pointwise_weight(w, 900, 1, False, 0, 14).size == 0
    monkeypatch.setattr(pointwise, "_taps_ready", lambda: False)
    assert pointwise.pointwise_weight(w, 900, 1, False, 0, 30).size == 0
    x = RNG.standard_normal((1, 3, 60, 60)).astype(np.float32)
    y = np.full((1, 64, 30, 30), np.nan, np.float32)
    pointwise.pointwise_range(x, w, E, y, 0, 1, 2, 2, 3, 3, 1, 1, 1, E, -INF, INF, E)
    np.testing.assert_allclose(y, _oracle(x, w, 2, 2, 3, 3, 1, 1, 30, 30, E, E, -INF, INF),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,h,k,s,p,m", [(3, 60, 7, 2, 3, 128), (5, 61, 5, 2, 2, 128),
                                         (40, 28, 3, 1, 1, 128), (17, 14, 3, 2, 1, 200),
                                         (9, 14, 3, 2, 1, 480), (3, 120, 5, 2, 2, 192)])
def test_split_over_threads_gives_the_one_calls_bits(ready, monkeypatch, counted, c, h, k, s,
                                                     p, m):
    """A one-sample call split by a parallel loop into three parts: the parts pad the image
    together (each its share of the input channels: 3 in 1, 1, 1; 5 in 1, 2, 2), then each
    computes its tiles (by rows where the image is the larger, else whole panels each and the
    panels left by rows): the one call's bits, its residual in another buffer and in the
    output's own; tiles of 7 pixels onto a 7x7 plane too."""
    loops = _team_loops(monkeypatch)
    x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
    w = RNG.standard_normal((m, c, k, k)).astype(np.float32)
    oh = _out(h, k, s, p, 1)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(m * oh * oh).astype(np.float32)
    ap = pointwise.pointwise_weight(w, oh * oh, 1, False, 0, oh)
    assert ap.size
    geo = (s, s, p, p, 1, 1, 1)
    one = np.full((1, m, oh, oh), np.nan, np.float32)
    pointwise.pointwise_range(x, w, ap, one, 0, 1, *geo, bias, 0.0, 6.0, res)
    assert len(counted) == 1
    np.testing.assert_allclose(one, _oracle(x, w, s, s, p, p, 1, 1, oh, oh, bias, res, 0.0,
                                            6.0), rtol=1e-4, atol=1e-4)
    for rows in _split_by_rows(x, w, ap, geo, bias, res, one, loops, pointwise._taps_parts):
        # (by panels where the packed filter outweighs the image: a group of rows per part)
        assert rows.shape[1] == 4 and (rows[:, 0] == 0).all() and (rows[:, -1] == oh).all()
        npan = -(-m // pointwise._step(pointwise._taps_pays(m, c, k, k, oh)))
        assert rows.shape[0] == (4 if ap.size > x[0].size and npan >= 3 else 2)


def _tiles(rows, pans):
    """Each (panel, row) of a plan of :func:`team.plan` with the parts that compute it; and
    the tiles of each part (rows times panels)."""
    owners, per = {}, [0] * (rows.shape[1] - 1)
    for g in range(rows.shape[0]):
        for j in range(pans[g], pans[g + 1]):
            for q in range(rows.shape[1] - 1):
                for r in range(rows[g, q], rows[g, q + 1]):
                    owners.setdefault((j, r), []).append(q)
                    per[q] += 1
    return owners, per


@pytest.mark.parametrize("by_panels", [False, True])
@pytest.mark.parametrize("parts,oh,npan", [(2, 7, 11), (2, 14, 6), (3, 7, 11), (2, 112, 1),
                                           (2, 28, 2), (3, 29, 5), (4, 7, 2), (2, 1, 3)])
def test_a_plan_computes_every_tile_once_and_deals_them_evenly(by_panels, parts, oh, npan):
    """Every (panel, output row) is computed by one part, and the parts' tiles differ by at
    most a panel's share of a row range: 7 rows of 11 panels on two threads give 38 and 39
    of the 77 tiles by rows (3 rows of every panel and the fourth of half of them, not 44
    and 33), and by panels 5 panels each and the eleventh by rows (3 and 4 rows)."""
    rows, pans = team.plan(parts, oh, npan, by_panels)
    owners, per = _tiles(rows, pans)
    assert sorted(owners) == [(j, r) for j in range(npan) for r in range(oh)]
    assert all(len(v) == 1 for v in owners.values())
    assert max(per) - min(per) <= (oh if by_panels and npan >= parts else npan)
    if (parts, oh, npan) == (2, 7, 11):
        assert per == [38, 39]
        assert (rows.shape[0] == 3) == by_panels


def test_compiled_code_packs_and_reads_the_taps():
    """In compiled code (a native driver, an ahead-of-time artifact) the filter is packed at
    each run and the tiles read the taps, as in Python."""
    @caller
    def call(x, w, y, bias):
        oh, ow = y.shape[2], y.shape[3]
        ap = pointwise.pointwise_weight(w, oh * ow, x.shape[0], False, 0, ow)
        pointwise.pointwise_range(x, w, ap, y, 0, x.shape[0], 2, 2, 3, 3, 1, 1, 1, bias, 0.0,
                                  INF, bias[:0])
        return ap.size

    w = RNG.standard_normal((64, 3, 7, 7)).astype(np.float32)
    bias = RNG.standard_normal(64).astype(np.float32)
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    y = np.full((1, 64, 32, 32), np.nan, np.float32)
    assert call(x, w, y, bias) == 64 * 147
    np.testing.assert_allclose(y, _oracle(x, w, 2, 2, 3, 3, 1, 1, 32, 32, bias, E, 0.0, INF),
                               rtol=1e-4, atol=1e-4)


def test_a_programs_first_layer_takes_them(fresh_programs, ready, counted):
    """A network's first layer (7x7 stride 2 from 3 channels, its bias and relu) in a
    program: the tiles reading the taps, natively, against NumPy."""
    main, _ = fresh_programs
    x = fluid.layers.data("x", [3, 64, 64])
    y = fluid.layers.conv2d(x, 64, 7, stride=2, padding=3, act="relu",
                            param_attr=fluid.ParamAttr(name="w1"),
                            bias_attr=fluid.ParamAttr(name="b1"))
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.global_scope()
    w = (RNG.standard_normal((64, 3, 7, 7)) / 12).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    for name, v in (("w1", w), ("b1", b)):
        scope.var(name).get_tensor().set(v, fluid.CPUPlace())
    xv = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    for _ in range(2):
        got, = exe.run(main, feed={"x": xv}, fetch_list=[y])
    assert_native(exe)
    assert counted
    np.testing.assert_allclose(got, _oracle(xv, w, 2, 2, 3, 3, 1, 1, 32, 32, b, E, 0.0, INF),
                               rtol=1e-4, atol=1e-4)
