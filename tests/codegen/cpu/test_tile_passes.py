"""Register tiles summed by passes (``tile.sum_passes``): where a tile's sums do not fit the
vector registers (no AVX-512), its loop over ``k`` runs once per group of rows and vectors.
Every output is the same sum in the same order as in one pass, so both give the same bits;
each is checked against NumPy here, on any machine (``PASS_ROWS`` set while the tile
compiles)."""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu.lib import pgemm, tile
from pdjit.codegen.cpu.lib._jit import caller

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("limit", [0, 3, 6])
@pytest.mark.parametrize("mr,nv", [(6, 4), (8, 3), (7, 3), (16, 1), (1, 4), (2, 4), (28, 1),
                                   (3, 2)])
def test_passes_cover_every_sum_once(monkeypatch, limit, mr, nv):
    monkeypatch.setattr(tile, "PASS_ROWS", limit)
    seen = []
    for r0, r1, v0, v1 in tile.sum_passes(mr, nv):
        assert 0 <= r0 < r1 <= mr and 0 <= v0 < v1 <= nv
        if limit:
            assert (r1 - r0) * (v1 - v0) <= max(limit, 1)
        seen += [(r, v) for r in range(r0, r1) for v in range(v0, v1)]
    assert sorted(seen) == [(r, v) for r in range(mr) for v in range(nv)]
    if not limit:
        assert tile.sum_passes(mr, nv) == [(0, mr, 0, nv)]


def _taps_tile(monkeypatch, limit, mr, nv):
    """A fresh caller of a fresh ``tile_kernel(mr, nv)``, compiled with ``PASS_ROWS`` =
    ``limit``."""
    monkeypatch.setattr(tile, "PASS_ROWS", limit)
    kernel = tile.tile_kernel(mr, nv)

    @numba.njit(no_cfunc_wrapper=True)
    def run(wf, wk, kk, xs, tap, df, ds, more):
        kernel(wf, 0, wk, kk, xs, 0, tap, 0, df, 0, ds, 0, more)

    return run


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mr,nv", [(8, 3), (6, 4), (4, 1)])
def test_taps_tile_by_passes_sums_as_one_pass(monkeypatch, dtype, mr, nv):
    lanes = 64 // np.dtype(dtype).itemsize
    kk, width = 37, nv * lanes
    w = RNG.standard_normal((mr, kk)).astype(dtype)
    tap = RNG.permutation(kk * 3)[:kk].astype(np.int64) * 5
    xs = RNG.standard_normal(int(tap.max()) + width).astype(dtype)
    start = RNG.standard_normal((mr, width + 3)).astype(dtype)
    want = np.stack([xs[t:t + width] for t in tap]).astype(np.float64)  # [kk, width]
    results = {}
    for limit in (0, 3, 6):
        run = _taps_tile(monkeypatch, limit, mr, nv)
        for more in (False, True):
            df = start.copy()
            run(w.reshape(-1), kk, kk, xs, tap, df.reshape(-1), width + 3, more)
            expect = w.astype(np.float64) @ want + (start[:, :width] if more else 0)
            np.testing.assert_allclose(df[:, :width], expect, rtol=1e-4 if dtype == np.float32
                                       else 1e-12, atol=1e-4 if dtype == np.float32 else 1e-12)
            assert np.array_equal(df[:, width:], start[:, width:])  # nothing past the tile
            results[limit, more] = df
    for more in (False, True):
        assert np.array_equal(results[0, more], results[3, more])
        assert np.array_equal(results[0, more], results[6, more])


def _gemm_tile(monkeypatch, limit):
    """A fresh caller of pgemm's plain ``MR x NV`` tile compiled with ``PASS_ROWS`` =
    ``limit``: ``c = clamp(a @ b + bias + res)`` for one tile."""
    monkeypatch.setattr(tile, "PASS_ROWS", limit)
    micro = pgemm._micro_kernel(pgemm.MR, pgemm.NV, pgemm.PREFETCH_ROWS)

    @caller
    def run(a, rows, kk, bp, c, cols, bias, res, lo, hi):
        micro(a, 0, kk, rows, kk, bp, 0, c, 0, cols, cols, bias, 0, res, lo, hi)

    return run


@pytest.mark.parametrize("rows,cols", [(pgemm.MR, 64), (5, 61), (1, 17)])
def test_gemm_tile_by_passes_sums_as_one_pass(monkeypatch, rows, cols):
    kk = 150
    a = RNG.standard_normal((rows, kk)).astype(np.float32)
    b = RNG.standard_normal((kk, cols)).astype(np.float32)
    bp = np.empty(pgemm.packed_b_size(kk, cols, 4), np.float32)
    pgemm.pack_b(b, bp)
    bias = RNG.standard_normal(cols).astype(np.float32)
    res = RNG.standard_normal(rows * cols).astype(np.float32)
    none = np.empty(0, np.float32)
    want = a.astype(np.float64) @ b
    results = []
    for limit in (0, 6, 3):
        run = _gemm_tile(monkeypatch, limit)
        got = {}
        for name, bb, rr, lo, hi in (("plain", none, none, -np.inf, np.inf),
                                      ("epilogue", bias, res, 0.0, 1.5)):
            c = np.full(rows * cols, np.nan, np.float32)
            run(a.reshape(-1), rows, kk, bp, c, cols, bb, rr, lo, hi)
            expect = want if name == "plain" else np.clip(
                want + bias + res.reshape(rows, cols), 0.0, 1.5)
            np.testing.assert_allclose(c.reshape(rows, cols), expect, rtol=1e-4, atol=1e-4)
            got[name] = c
        results.append(got)
    for other in results[1:]:
        for name in ("plain", "epilogue"):
            assert np.array_equal(results[0][name], other[name])


def test_the_pass_size_follows_the_cpus_registers():
    assert tile._pass_rows("+avx512f,+avx2,+avx,+fma") == 0       # 32 registers of 64 bytes
    assert tile._pass_rows("-avx512f,+avx2,+avx,+fma") == 6       # 16 of 32 bytes
    assert tile._pass_rows("-avx512f,-avx2,-avx,+sse4.2") == 3    # 16 of 16 bytes
    assert tile._pass_rows("") == 3


def test_prefetches_fill_l1_on_amds_zen_cores_only():
    """A prefetch for L2 fills L1 too on AMD's Zen cores (the conv tiles then fetch nothing
    ahead: each fetch would evict a line of the chunk they read); not on Intel's."""
    for name in ("znver1", "znver3", "znver4", "znver5"):
        assert tile._prefetch_fills_l1(name)
    for name in ("sapphirerapids", "skylake-avx512", "icelake-server", "haswell", "generic"):
        assert not tile._prefetch_fills_l1(name)
