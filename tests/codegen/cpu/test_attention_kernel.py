"""``lib.scaled_attention``: attention's core in one kernel, against NumPy written here, on the
strided views the op hands it (heads of a ``[batch, seq, heads, dim]`` projection), odd sizes
(rows and keys not multiples of the tile, keys over several panels and row blocks), masks
broadcast several ways, float32 and float64; the split over the parallel loop and the compiled
version inside a native driver give the host's bits."""
import importlib

import numpy as np
import pytest

from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.lib import _jit, scaled_attention, team

att = importlib.import_module("pdjit.codegen.cpu.lib.attention")


def oracle(q, k, v, mask, alpha):
    """softmax(alpha q k^T + mask) v in float64, ``x - max`` clipped at -64 (loops over the
    batch's matrices)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lead = q.shape[:-2]
    sq, sk = q.shape[-2], k.shape[-2]
    m = np.zeros(lead + (sq, sk)) if mask is None else np.broadcast_to(
        np.asarray(mask, np.float64), lead + (sq, sk))
    out = np.zeros(lead + (sq, v.shape[-1]))
    for idx in np.ndindex(*lead):
        s = alpha * (q[idx] @ k[idx].T) + m[idx]
        e = np.exp(np.maximum(s - s.max(axis=1, keepdims=True), -64.0))
        out[idx] = (e / e.sum(axis=1, keepdims=True)) @ v[idx]
    return out


def heads(rng, b, s, h, d, dtype):
    """``[b, h, s, d]`` views of a ``[b, s, h, d]`` array (as a projection's heads are)."""
    return rng.standard_normal((b, s, h, d)).astype(dtype).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("b,h,sq,sk,d,dv", [
    (1, 4, 128, 128, 64, 64),      # an encoder's heads at batch 1
    (2, 3, 37, 29, 20, 33),        # nothing a multiple of the tile
    (1, 2, 5, 130, 7, 70),         # keys and values over several panels
    (2, 1, 1, 1, 1, 1),
])
def test_heads_against_numpy(dtype, b, h, sq, sk, d, dv):
    rng = np.random.default_rng(sq * 31 + sk)
    q, k, v = heads(rng, b, sq, h, d, dtype), heads(rng, b, sk, h, d, dtype), \
        heads(rng, b, sk, h, dv, dtype)
    keep = rng.random((b, 1, 1, sk)) < 0.8
    for mask in (None, np.where(keep, 0.0, -1e4).astype(dtype),          # a padding mask
                 rng.standard_normal((sq, sk)).astype(dtype),             # a bias of the scores
                 rng.standard_normal((1, h, sq, sk)).astype(dtype)):
        out = np.full((b, sq, h, dv), np.nan, dtype)
        scaled_attention(q, k, v, mask, 0.3, out.transpose(0, 2, 1, 3))
        tol = 2e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out.transpose(0, 2, 1, 3), oracle(q, k, v, mask, 0.3),
                                   rtol=tol, atol=tol)


def test_rows_in_blocks_and_contiguous_operands():
    """Scores wider than a thread's buffer holds for the whole query: rows in blocks; plain
    C-contiguous operands of rank 3."""
    rng = np.random.default_rng(5)
    sk = 1100
    assert att._BLOCK_BYTES // (sk * 4) < 50
    q = rng.standard_normal((2, 50, 16)).astype(np.float32)
    k = rng.standard_normal((2, sk, 16)).astype(np.float32)
    v = rng.standard_normal((2, sk, 24)).astype(np.float32)
    out = np.empty((2, 50, 24), np.float32)
    scaled_attention(q, k, v, None, 0.25, out)
    np.testing.assert_allclose(out, oracle(q, k, v, None, 0.25), rtol=2e-5, atol=2e-5)


def test_a_nan_spoils_its_rows_only():
    """A NaN in a query row: that row's scores, softmax and output are NaN (as NumPy's), the
    others as without it (the row's vector max skips a NaN as a scalar chain does; the
    exponentials carry it)."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    q[0, 1, 3, 5] = np.nan
    out = np.empty((1, 2, 40, 16), np.float32)
    scaled_attention(q, k, v, None, 0.5, out)
    bad = np.isnan(out).any(axis=-1)
    assert bad[0, 1, 3] and bad.sum() == 1 and np.isnan(out[0, 1, 3]).all()
    ok = ~np.isnan(oracle(q, k, v, None, 0.5))
    np.testing.assert_allclose(out[ok], oracle(q, k, v, None, 0.5)[ok], rtol=2e-5, atol=2e-5)


def test_operands_broadcast_over_the_batch():
    """Keys and values shared by the heads (``[b, 1, sk, d]``), queries of one sample for
    every batch entry: NumPy's broadcasting, read in place."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)
    k = rng.standard_normal((3, 1, 11, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 11, 5)).astype(np.float32)
    out = np.full((3, 4, 9, 5), np.nan, np.float32)
    scaled_attention(q, k, v, None, 0.5, out)
    want = oracle(*(np.broadcast_to(x, (3, 4) + x.shape[-2:]) for x in (q, k, v)), None, 0.5)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_empty_operands_and_errors():
    z = np.zeros((1, 3, 0, 4), np.float32)
    v = np.ones((1, 3, 0, 5), np.float32)
    out = np.full((1, 3, 2, 5), np.nan, np.float32)
    scaled_attention(np.ones((1, 3, 2, 4), np.float32), z, v, None, 1.0, out)
    assert np.array_equal(out, np.zeros_like(out))      # no keys: nothing to weigh
    q = np.ones((2, 4, 3), np.float32)
    with pytest.raises(ValueError, match="the mask \\[3, 4, 5\\] does not broadcast"):
        scaled_attention(q, np.ones((2, 5, 3), np.float32), np.ones((2, 5, 2), np.float32),
                         np.zeros((3, 4, 5), np.float32), 1.0, np.empty((2, 4, 2), np.float32))
    with pytest.raises(ValueError, match="scaled_attention: q .* do not fit"):
        scaled_attention(np.ones((2, 4, 3), np.float32), np.ones((2, 5, 4), np.float32),
                         np.ones((2, 5, 6), np.float32), None, 1.0,
                         np.empty((2, 4, 6), np.float32))


def test_split_over_the_parallel_loop_gives_one_threads_bits(monkeypatch, team_loops):
    rng = np.random.default_rng(7)
    q, k, v = (heads(rng, 2, 128, 4, 64, np.float32) for _ in range(3))
    mask = np.where(rng.random((2, 1, 1, 128)) < 0.9, 0, -1e4).astype(np.float32)
    one = np.empty((2, 4, 128, 64), np.float32)
    monkeypatch.setattr(threads, "loop_threads", lambda: 1)
    scaled_attention(q, k, v, mask, 0.125, one)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    monkeypatch.setattr(team, "_READY", {})      # (what other tests' runs left aside)
    team_loops.clear()
    two = np.full_like(one, np.nan)
    scaled_attention(q, k, v, mask, 0.125, two)
    assert team_loops == [(att._heads_parts, 2, True)]
    assert np.array_equal(one, two)
    monkeypatch.setattr(team, "run", lambda loop, call: False)  # not ready: on the helpers
    helpers = np.full_like(one, np.nan)
    scaled_attention(q, k, v, mask, 0.125, helpers)
    assert np.array_equal(one, helpers)


@_jit.caller
def _native(q, k, v, o):
    scaled_attention(q.transpose((0, 2, 1, 3)), k.transpose((0, 2, 1, 3)),
                     v.transpose((0, 2, 1, 3)), None, 0.3, o.transpose((0, 2, 1, 3)))


@_jit.caller
def _native_plain(q, k, v, o):
    scaled_attention(q, k, v, None, 0.5, o)


@_jit.caller
def _native_masked(q, k, v, m, o):
    scaled_attention(q.transpose((0, 2, 1, 3)), k.transpose((0, 2, 1, 3)),
                     v.transpose((0, 2, 1, 3)), m, 0.3, o)


def test_compiled_code_gives_the_hosts_bits():
    """Inside compiled code (a native driver): one thread on the same views, the same bits;
    an output whose last dim is strided written through a copy."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 37, 3, 20)).astype(np.float32) for _ in range(3))
    host = np.empty((2, 37, 3, 20), np.float32)
    scaled_attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), None, 0.3,
                     host.transpose(0, 2, 1, 3))
    got = np.full_like(host, np.nan)
    _native(q, k, v, got)
    assert np.array_equal(got, host)
    mask = np.where(rng.random((2, 1, 1, 37)) < 0.8, 0, -1e4).astype(np.float32)
    host = np.empty((2, 3, 37, 20), np.float32)
    scaled_attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), mask, 0.3, host)
    base = np.full((2, 3, 20, 37), np.nan, np.float32)
    _native_masked(q, k, v, mask, base.transpose(0, 1, 3, 2))   # last dim strided
    assert np.array_equal(base.transpose(0, 1, 3, 2), host)
    np.testing.assert_allclose(host, oracle(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)),
                                            mask, 0.3), rtol=2e-5, atol=2e-5)
    # keys and values broadcast over the heads
    q = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 11, 8)).astype(np.float32)
    v = rng.standard_normal((2, 1, 11, 5)).astype(np.float32)
    host, got = np.empty((2, 4, 9, 5), np.float32), np.full((2, 4, 9, 5), np.nan, np.float32)
    scaled_attention(q, k, v, None, 0.5, host)
    _native_plain(q, k, v, got)
    assert np.array_equal(got, host)


def test_views_of_other_arrays_read_from_their_own_first_element():
    """Operands that are not permutations of a whole array (a slice of heads, a strided view
    of an array with more elements, a view starting inside its base) read from where they
    start, not from their base's first element."""
    rng = np.random.default_rng(11)
    big = rng.standard_normal((2, 10, 3, 4, 8)).astype(np.float32)   # [b, s, qkv, h, d]
    q, k, v = (big[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    inner = rng.standard_normal((3, 4, 10, 8)).astype(np.float32)[1:]  # starts inside
    out = np.empty((2, 4, 10, 8), np.float32)
    scaled_attention(q, inner, v, None, 0.4, out)
    np.testing.assert_allclose(out, oracle(q, inner, v, None, 0.4), rtol=2e-5, atol=2e-5)


def test_masks_of_any_rank_and_operands_of_any_base():
    """Masks of rank 0 and 1, keys broadcast, strided rows; an operand whose base is no array
    (``as_strided``, a buffer): each as NumPy's broadcasting reads it, host and compiled."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 4)))
    masks = [np.float32(0.3) * np.ones((), np.float32), rng.standard_normal(9),
             rng.standard_normal((1, 1, 7, 1)), rng.standard_normal((9, 7)).T]
    for m in (np.asarray(x, np.float32) for x in masks):
        host, got = np.empty((2, 3, 7, 4), np.float32), np.full((2, 3, 7, 4), np.nan, np.float32)
        scaled_attention(q, k, v, m, 0.5, host)
        _native_masked_plain(q, k, v, m, got)
        np.testing.assert_allclose(host, oracle(q, k, v, m, 0.5), rtol=2e-5, atol=2e-5)
        assert np.array_equal(got, host)
    base = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
    for kk in (np.lib.stride_tricks.as_strided(base, shape=(2, 3, 9, 5),
                                               strides=base.strides[:-1] + (8,)),
               np.ndarray((2, 3, 9, 5), np.float32, buffer=bytearray(base.tobytes()),
                          strides=base.strides[:-1] + (8,))):
        out = np.empty((2, 3, 7, 4), np.float32)
        scaled_attention(q, kk, v, None, 0.5, out)
        np.testing.assert_allclose(out, oracle(q, kk, v, None, 0.5), rtol=2e-5, atol=2e-5)


@_jit.caller
def _native_masked_plain(q, k, v, m, o):
    scaled_attention(q, k, v, m, 0.5, o)


def test_compiled_code_refuses_what_the_host_refuses_and_weighs_without_dims():
    """A mask that does not broadcast: a clear error in compiled code too; queries and keys of
    no dims: every score 0, the softmax uniform (the mean of the values), as the host."""
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 4)))
    for bad in (np.zeros((2, 9), np.float32), np.zeros((3, 1, 1, 9), np.float32)):
        with pytest.raises(ValueError, match="does not broadcast"):
            _native_masked_plain(q, k, v, bad, np.empty((2, 3, 7, 4), np.float32))
    q0, k0 = np.zeros((2, 3, 7, 0), np.float32), np.zeros((2, 3, 9, 0), np.float32)
    host, got = np.empty((2, 3, 7, 4), np.float32), np.full((2, 3, 7, 4), np.nan, np.float32)
    scaled_attention(q0, k0, v, None, 0.5, host)
    _native_masked_plain(q0, k0, v, np.zeros(9, np.float32), got)
    want = np.broadcast_to(v.mean(axis=2, keepdims=True), host.shape)
    np.testing.assert_allclose(host, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
