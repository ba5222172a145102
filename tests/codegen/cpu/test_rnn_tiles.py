"""The forward time loop of the ``rnn`` kernels (``pdjit.codegen.cpu.lib.rnn``) on both of its
paths for ``W_hh h``: one BLAS call for a small slice, register tiles of rows of ``W_hh`` by a
vector of sequences from ``TILE_MIN_BATCH`` sequences on (float64: vectors of 8, so a batch of
11 is two vectors, the second padded). Hidden sizes are odd, so that the rows of ``W_hh`` are
no multiple of a tile's rows (the 24-, 8- and 1-row tiles all run). The oracle is a NumPy
network written here from Paddle's cells (LSTM gates i, f, c~, o; GRU gates r, z, c~ with
``c~ = tanh(W_ic x + b_ic + r * (W_hc h + b_hc))``, ``h = z * h' + (1 - z) * c~``; the reverse
direction from the last step; past a length the state is kept and zeros are written).
"""
import functools
import math

import numpy as np
import pytest

from pdjit.codegen.cpu.lib import pgemm
from pdjit.codegen.cpu.lib import rnn as K
from pdjit.codegen.cpu.lib._jit import caller

RNG = np.random.default_rng(5)
CODES = {"LSTM": (0, 4), "GRU": (1, 3), "RNN_TANH": (2, 1)}


def sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def oracle(mode, x, h0, c0, ws, L, D, lens):
    T, B, _ = x.shape
    nw = 2 * L * D
    inp, hs, cs = x, [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            k = layer * D + d
            wih, whh, bih, bhh = ws[2 * k], ws[2 * k + 1], ws[nw + 2 * k], ws[nw + 2 * k + 1]
            h, c = h0[k].copy(), c0[k].copy()
            out = np.zeros((T, B, h.shape[1]))
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                gx, gh = inp[t] @ wih.T + bih, h @ whh.T + bhh
                cn = c
                if mode == "LSTM":
                    i, f, g, o = np.split(gx + gh, 4, axis=1)
                    cn = sig(f) * c + sig(i) * np.tanh(g)
                    hn = sig(o) * np.tanh(cn)
                elif mode == "GRU":
                    (xr, xz, xc), (hr, hz, hc) = np.split(gx, 3, 1), np.split(gh, 3, 1)
                    r, z = sig(xr + hr), sig(xz + hz)
                    hn = z * h + (1 - z) * np.tanh(xc + r * hc)
                else:
                    hn = np.tanh(gx + gh)
                alive = (t < lens)[:, None]
                h, c = np.where(alive, hn, h), np.where(alive, cn, c)
                out[t] = np.where(alive, hn, 0.0)
            outs.append(out)
            hs.append(h)
            cs.append(c)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hs), np.stack(cs)


def _network(G, H, L, D, T, B, I):
    """Random weights (Paddle's order: w_ih, w_hh of each layer and direction, then the
    biases), inputs [T, B, I] and initial states of a network of ``G`` gates."""
    ws = []
    for layer in range(L):
        for _ in range(D):
            ws += [RNG.normal(size=(G * H, I if layer == 0 else D * H)) * 0.5,
                   RNG.normal(size=(G * H, H)) * 0.5]
    ws += [RNG.normal(size=G * H) * 0.5 for _ in range(2 * L * D)]
    x = RNG.normal(size=(T, B, I))
    return ws, x, RNG.normal(size=(L * D, B, H)), RNG.normal(size=(L * D, B, H))


@pytest.mark.parametrize("mode,H,L,D", [("LSTM", 5, 2, 2), ("GRU", 9, 1, 2),
                                        ("RNN_TANH", 7, 2, 1)])
def test_forward_on_both_product_paths_matches_numpy(mode, H, L, D):
    code, G = CODES[mode]
    T, I = 5, 3
    assert 1 < K.TILE_MIN_BATCH <= 4
    for B in (1, 4, 11):  # BLAS; tiles of one vector; two vectors (the second padded)
        ws, x, h0, c0 = _network(G, H, L, D, T, B, I)
        lens = RNG.integers(0, T + 1, B).astype(np.int64)
        lens[0] = T
        want = oracle(mode, x, h0, c0 if mode == "LSTM" else np.zeros_like(h0), ws, L, D,
                      lens)
        table = K.rnn_weight_table(ws[:2 * L * D], ws[2 * L * D:])
        flat = np.concatenate([w.ravel() for w in ws])
        for save in (False, True):  # inference; training (the reserve written too)
            out, hn, cn = (np.empty((T, B, D * H)), np.empty_like(h0), np.empty_like(h0))
            reserve = np.empty(K.rnn_reserve_size(code, T, B, H, L, D) if save else 0)
            args = (lens, code, L, D, save, np.empty(0, np.uint8), 1.0, out, hn, cn, reserve)
            if save:
                K.rnn_forward(x, h0, c0, flat, *args, parts=1)
            else:
                K.rnn_forward_at(x, h0, c0, table, *args, parts=1)
            np.testing.assert_allclose(out, want[0], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{mode} B={B}")
            np.testing.assert_allclose(hn, want[1], rtol=1e-10, atol=1e-12)
            if mode == "LSTM":
                np.testing.assert_allclose(cn, want[2], rtol=1e-10, atol=1e-12)


@caller  # (compiled as a generated kernel is)
def _compiled_table(weights, biases, steps, batch):
    return K.rnn_weight_table(weights, biases, steps, batch, True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode,H,L,D", [("LSTM", 5, 2, 2), ("GRU", 9, 1, 2),
                                        ("RNN_TANH", 7, 2, 1)])
def test_forward_on_packed_weights_matches_numpy(mode, H, L, D, dtype):
    """With the matrices packed transposed in the table (kept copies; or packed by compiled
    code into the table itself, where packing at each run pays), the input projections run
    on pdjit's GEMM, the biases in its epilogue, and each step's ``W_hh h`` on it too (one
    sequence: the one-row tiles): the oracle's results, and the unpacked table's within
    rounding."""
    code, G = CODES[mode]
    T, I = 24, 3
    n = 2 * L * D
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-5)
    for B in (1, 5, 11):  # one row; rows not a multiple of the GEMM's six
        ws, x, h0, c0 = (np.asarray(a, dtype) if not isinstance(a, list) else
                         [np.asarray(w, dtype) for w in a] for a in _network(G, H, L, D, T, B, I))
        lens = RNG.integers(0, T + 1, B).astype(np.int64)
        lens[0] = T
        want = oracle(mode, x, h0, c0 if mode == "LSTM" else np.zeros_like(h0), ws, L, D,
                      lens)
        tables = {"unpacked": K.rnn_weight_table(ws[:n], ws[n:]),
                  "kept": K.rnn_weight_table(ws[:n], ws[n:], T, B, True),
                  "each run": K.rnn_weight_table(ws[:n], ws[n:], T, B),
                  "compiled": _compiled_table(tuple(ws[:n]), tuple(ws[n:]), T, B)}
        assert tables["unpacked"].shape[0] == 2 * n == tables["kept"].shape[0] - n
        # packed at each run where it pays: not for one sequence of 24 steps
        packs = T * (B + 2) >= K.PACK_EVERY_RUN_MIN
        assert packs == (B > 1)
        assert tables["each run"].shape[0] == (3 * n if packs else 2 * n)
        assert tables["compiled"].shape[0] >= 3 * n if packs else \
            tables["compiled"].shape[0] == 2 * n
        got = {}
        for name, table in tables.items():
            out, hn, cn = np.empty((T, B, D * H), dtype), np.empty_like(h0), np.empty_like(h0)
            K.rnn_forward_at(x, h0, c0, table, lens, code, L, D, False, np.empty(0, np.uint8),
                             1.0, out, hn, cn, np.empty(0, dtype), parts=1)
            np.testing.assert_allclose(out, want[0], **tol, err_msg=f"{name} {mode} B={B}")
            np.testing.assert_allclose(hn, want[1], **tol)
            if mode == "LSTM":
                np.testing.assert_allclose(cn, want[2], **tol)
            got[name] = out
        if packs:
            assert np.array_equal(got["compiled"], got["kept"])  # the same kernels
        for parts in (2, 4):  # threads: the directions at once, slices of the batch
            out = np.empty((T, B, D * H), dtype)
            K.rnn_forward_at(x, h0, c0, tables["kept"], lens, code, L, D, False,
                             np.empty(0, np.uint8), 1.0, out, np.empty_like(h0),
                             np.empty_like(h0), np.empty(0, dtype), parts=parts)
            assert np.array_equal(out, got["kept"])


def _loss(mode, shapes, L, D, lens, r, rh, rc, flat, x, h0, c0):
    """``sum(out * r) + sum(h_n * rh) (+ sum(c_n * rc))`` of the oracle's network of the
    weights flattened into ``flat`` (their ``shapes``)."""
    ws, at = [], 0
    for shape in shapes:
        ws.append(flat[at:at + math.prod(shape)].reshape(shape))
        at += math.prod(shape)
    out, hn, cn = oracle(mode, x, h0, c0, ws, L, D, lens)
    return (out * r).sum() + (hn * rh).sum() + ((cn * rc).sum() if mode == "LSTM" else 0.0)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
def test_backward_on_packed_weights_matches_finite_differences(mode):
    """Over 32 steps packing the weights pays (one sequence too): each step's ``dh @ W_hh``
    and the input gradient ``dxp @ W_ih`` run on the packed GEMM (one sequence: the one-row
    tiles). The gradients of ``sum(out * R) + sum(h_n * R_h) (+ sum(c_n * R_c))`` of a
    2-layer bidirectional network, with lengths, against central differences of the NumPy
    oracle along random directions (float64)."""
    code, G = CODES[mode]
    T, I, H, L, D = 32, 3, 5, 2, 2
    for B in (1, 3):
        assert K._pays_every_run(T, B)
        ws, x, h0, c0 = _network(G, H, L, D, T, B, I)
        if mode != "LSTM":
            c0 = np.zeros_like(h0)
        lens = np.full(B, T, np.int64)
        lens[-1] = T - 5 if B > 1 else T
        flat = np.concatenate([w.ravel() for w in ws])
        r, rh, rc = RNG.normal(size=(T, B, D * H)), RNG.normal(size=h0.shape), \
            RNG.normal(size=h0.shape)
        loss = functools.partial(_loss, mode, [w.shape for w in ws], L, D, lens, r, rh, rc)
        out, hn, cn = np.empty((T, B, D * H)), np.empty_like(h0), np.empty_like(h0)
        reserve = np.empty(K.rnn_reserve_size(code, T, B, H, L, D))
        K.rnn_forward(x, h0, c0, flat, lens, code, L, D, True, np.empty(0, np.uint8), 1.0,
                      out, hn, cn, reserve, parts=1)
        dx, dh0, dc0, dw = (np.empty_like(x), np.empty_like(h0), np.empty_like(h0),
                            np.empty_like(flat))
        K.rnn_backward(x, flat, lens, code, L, D, H, reserve, np.empty(0, np.uint8), 1.0, r,
                       rh, rc if mode == "LSTM" else np.zeros_like(h0), dx, dh0, dc0, dw,
                       parts=1)
        eps = 1e-6
        for got, at in ((dw, 0), (dx, 1), (dh0, 2)) + (((dc0, 3),) if mode == "LSTM" else ()):
            v = RNG.normal(size=got.shape)
            args = [flat, x, h0, c0]
            up, down = list(args), list(args)
            up[at], down[at] = args[at] + eps * v, args[at] - eps * v
            want = (loss(*up) - loss(*down)) / (2 * eps)
            assert np.isclose((got * v).sum(), want, rtol=1e-6, atol=1e-6), (mode, B, at)


def test_pack_a_of_transpose_is_pack_a_of_the_transposed_copy():
    for dtype in (np.float32, np.float64):
        for k, m in ((7, 13), (1, 6), (40, 5)):
            a = RNG.normal(size=(k, m)).astype(dtype)
            want = np.full(pgemm.packed_rows_size(m, k), 9.0, dtype)
            got = want.copy()
            pgemm.pack_a(np.ascontiguousarray(a.T), want)
            pgemm.pack_a_of_transpose(a, got)
            assert np.array_equal(got, want)


def test_packed_vector_matches_numpy():
    """``pgemm.packed_vector``: one row by a matrix packed into panels, columns not a multiple
    of a panel's, with and without a bias."""
    for dtype in (np.float32, np.float64):
        for k, n in ((100, 300), (7, 5), (128, 384)):
            w = RNG.normal(size=(n, k)).astype(dtype)
            a, bias = RNG.normal(size=k).astype(dtype), RNG.normal(size=n).astype(dtype)
            bp = pgemm._pack(w, True)
            for b in (bias, bias[:0]):
                out = np.full(n + 3, 7.0, dtype)
                pgemm.packed_vector(a, bp, n, b, out)
                want = w.astype(np.float64) @ a + (b if b.size else 0)
                np.testing.assert_allclose(out[:n], want, rtol=1e-5, atol=1e-5)
                assert (out[n:] == 7.0).all()  # nothing written past n


def test_the_weight_table_refuses_what_does_not_fit():
    w2, b1 = np.zeros((6, 2)), np.zeros(6)
    with pytest.raises(ValueError, match=r"WeightList\[1\] is not a C-contiguous 2-D array"):
        K.rnn_weight_table([w2, np.zeros((2, 6)).T], [b1, b1])
    with pytest.raises(ValueError, match=r"WeightList\[2\] is not a C-contiguous 1-D array of "
                                         r"the dtype of the others \(float64\)"):
        K.rnn_weight_table([w2, w2], [b1.astype(np.float32), b1])
    with pytest.raises(ValueError, match=r"WeightList\[3\] is not a C-contiguous 1-D array"):
        K.rnn_weight_table([w2, w2], [b1, w2])
    # a GRU of 2 hidden over 2 inputs reads (6, 2) weights: a (6, 1) one is refused
    x, h0 = np.zeros((1, 1, 2)), np.zeros((1, 1, 2))
    table = K.rnn_weight_table([w2, np.zeros((6, 1))], [b1, b1])
    with pytest.raises(ValueError, match="a weight of WeightList has the wrong size"):
        K.rnn_forward_at(x, h0, h0, table, np.empty(0, np.int64), 1, 1, 1, False,
                         np.empty(0, np.uint8), 1.0, np.empty((1, 1, 2)), np.empty_like(h0),
                         np.empty_like(h0), np.empty(0))


@pytest.mark.parametrize("mode,L", [("LSTM", 3), ("GRU", 2)])
def test_the_directions_of_a_layer_run_at_once_with_one_threads_results(mode, L, monkeypatch):
    """A bidirectional network on several threads runs the two directions of each layer at
    once (each on the whole batch, or on slices of it from four threads), a layer's outputs
    but the last's in a buffer of two layers (three layers: the first's overwritten by the
    third's); the results are one thread's bit for bit and the oracle's, with the reserve of
    a training run (no dropout) too. (On ``run_parts``' helpers: the parallel loop that takes
    the split once it is ready, below, is not.)"""
    monkeypatch.setattr(K.team, "run", lambda loop, call: False)
    code, G = CODES[mode]
    T, I, H, D = 6, 4, 7, 2
    seen = []
    real = K.run_parts

    def run_parts(fn, parts, most=None):
        seen.append([p[15:21] for p in parts])
        return real(fn, parts, most)

    lanes = K.TILE_BYTES // 8  # (float64)
    for B in (1, 2 * lanes + 3):  # one sequence; three vectors of them
        ws, x, h0, c0 = _network(G, H, L, D, T, B, I)
        lens = np.full(B, T, np.int64)
        lens[-1] = T - 2
        want = oracle(mode, x, h0, c0 if mode == "LSTM" else np.zeros_like(h0), ws, L, D,
                      lens)
        table = K.rnn_weight_table(ws[:2 * L * D], ws[2 * L * D:])
        for save in (False, True):
            got = {}
            for parts in (1, 2, 4):
                out, hn, cn = (np.empty((T, B, D * H)), np.empty_like(h0), np.empty_like(h0))
                reserve = np.empty(K.rnn_reserve_size(code, T, B, H, L, D) if save else 0)
                seen.clear()
                K.run_parts = run_parts
                try:
                    K.rnn_forward_at(x, h0, c0, table, lens, code, L, D, save,
                                     np.empty(0, np.uint8), 1.0, out, hn, cn, reserve,
                                     parts=parts)
                finally:
                    K.run_parts = real
                got[parts] = (out, hn, cn, reserve)
                if parts == 1:
                    assert seen == []
                else:  # one call of run_parts a layer, its directions (and slices) at once
                    n = min(parts // 2, B if B < K.TILE_MIN_BATCH else -(-B // lanes))
                    assert seen == [[(p * B // n, (p + 1) * B // n, layer, layer + 1, d, d + 1)
                                     for d in range(D) for p in range(n)]
                                    for layer in range(L)]
            np.testing.assert_allclose(got[1][0], want[0], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(got[1][1], want[1], rtol=1e-10, atol=1e-12)
            for parts in (2, 4):
                for a, b in zip(got[1], got[parts]):
                    if mode == "GRU" and a is got[1][2]:
                        continue  # (a GRU has no cell state: cn is not written)
                    np.testing.assert_array_equal(a, b)


def test_the_split_runs_on_the_team_with_one_threads_results(team_loops):
    """Once its parallel loop is ready (``lib.team``), a split forward runs its parts on the
    team (one loop a layer: the two directions at once, or the slices of a batch), not on
    ``run_parts``' helpers; the results are one thread's bit for bit and the oracle's."""
    code, G = CODES["GRU"]
    T, I, H, L = 5, 4, 7, 2
    lanes = K.TILE_BYTES // 8  # (float64)
    B = 2 * lanes + 3
    for D, parts in ((2, 2), (1, 2)):
        ws, x, h0, c0 = _network(G, H, L, D, T, B, I)
        lens = np.full(B, T, np.int64)
        want = oracle("GRU", x, h0, np.zeros_like(h0), ws, L, D, lens)
        table = K.rnn_weight_table(ws[:2 * L * D], ws[2 * L * D:])
        got = {}
        for p in (1, parts):
            team_loops.clear()
            out, hn = np.empty((T, B, D * H)), np.empty_like(h0)
            K.rnn_forward_at(x, h0, c0, table, lens, code, L, D, False, np.empty(0, np.uint8),
                             1.0, out, hn, np.empty_like(h0), np.empty(0), parts=p)
            got[p] = out, hn
            ran = [(loop, n) for loop, n, done in team_loops if done]
            assert ran == ([] if p == 1 else [(K._fwd_parts, parts)] * (L if D == 2 else 1)), \
                (D, p, team_loops)
        np.testing.assert_allclose(got[1][0], want[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1][1], want[1], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(got[parts][0], got[1][0])
        np.testing.assert_array_equal(got[parts][1], got[1][1])


def test_a_batch_on_tiles_is_sliced_by_whole_vectors_of_sequences():
    """From ``TILE_MIN_BATCH`` sequences (whose steps run on tiles of a vector of sequences)
    a batch is cut in no more slices than it fills vectors: a slice of half a vector would
    pad it to a whole one, doubling the work of each; fewer sequences, one a slice."""
    lanes = K.TILE_BYTES // 4  # (float32)
    assert K._batch_slices(lanes, 2, 4) == 1
    assert K._batch_slices(lanes + 1, 2, 4) == 2
    assert K._batch_slices(4 * lanes, 2, 4) == 2 and K._batch_slices(4 * lanes, 8, 4) == 4
    assert K._batch_slices(K.TILE_MIN_BATCH - 1, 2, 4) == 2
    assert K._batch_slices(1, 2, 4) == 1 and K._batch_slices(lanes, 1, 4) == 1
    assert K._batch_slices(2 * (K.TILE_BYTES // 8), 2, 8) == 2  # (float64: shorter vectors)


@pytest.mark.parametrize("mode", ["GRU", "LSTM"])
def test_a_batch_on_the_packed_weights_is_sliced_by_tiles_of_sequences(mode, monkeypatch):
    """With ``W_hh`` packed (each step on pdjit's GEMM, ``pgemm.MR`` sequences a tile) a batch
    is cut in as many slices as it fills tiles, at most one per thread (16 sequences on two
    threads: two slices of 8, not one of 16 as on register tiles of a vector of 16); each
    slice's results are the whole batch's bit for bit, and the oracle's."""
    monkeypatch.setattr(K.team, "run", lambda loop, call: False)  # (the slices on helpers)
    assert K._batch_slices(16, 2, 4, True) == 2 and K._batch_slices(16, 2, 4) == 1
    assert K._batch_slices(pgemm.MR, 2, 4, True) == 1
    assert K._batch_slices(pgemm.MR + 1, 2, 4, True) == 2
    assert K._batch_slices(3 * pgemm.MR, 8, 4, True) == 3
    assert K._batch_slices(K.TILE_MIN_BATCH - 1, 2, 4, True) == 2
    code, G = CODES[mode]
    T, I, H, B = 5, 3, 9, 16
    ws, x, h0, c0 = _network(G, H, 1, 1, T, B, I)
    lens = np.full(B, T, np.int64)
    lens[3] = T - 2
    table = K.rnn_weight_table(ws[:2], ws[2:], T, B, kept=True)
    assert table.shape[0] >= 6  # (the matrices packed after the WeightList's rows)
    want = oracle(mode, x, h0, c0 if mode == "LSTM" else np.zeros_like(h0), ws, 1, 1, lens)
    seen, real = [], K.run_parts

    def run_parts(fn, parts, most=None):
        seen.append([p[15:17] for p in parts])
        return real(fn, parts, most)

    got = {}
    for parts in (1, 2):
        out, hn, cn = np.empty((T, B, H)), np.empty_like(h0), np.empty_like(h0)
        K.run_parts = run_parts
        try:
            K.rnn_forward_at(x, h0, c0, table, lens, code, 1, 1, False, np.empty(0, np.uint8),
                             1.0, out, hn, cn, np.empty(0), parts=parts)
        finally:
            K.run_parts = real
        got[parts] = (out, hn) + ((cn,) if mode == "LSTM" else ())
    assert seen == [[(0, 8), (8, 16)]]
    np.testing.assert_allclose(got[1][0], want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1][1], want[1], rtol=1e-10, atol=1e-12)
    for a, b in zip(got[1], got[2]):
        np.testing.assert_array_equal(a, b)


def test_the_weight_table_is_kept_while_its_arrays_and_copies_are():
    """A run's table is the one made before while its arrays are the same and so are their
    packed copies, handed out as a copy (the caller's to write); a run that may write a weight
    (its copy packed again), or other arrays, get a new one; a table goes with its arrays."""
    import gc

    from pdjit.codegen import params

    rng = np.random.default_rng(5)
    ws = [rng.standard_normal(s).astype(np.float32) for s in [(36, 8), (36, 12), (36,), (36,)]]
    key = (tuple(map(id, ws)), True)
    t1 = K.rnn_weight_table(ws[:2], ws[2:], 24, 1, True)
    kept = K._TABLES[key][2]
    again = K.rnn_weight_table(ws[:2], ws[2:], 24, 1, True)
    assert K._TABLES[key][2] is kept and again is not t1 and np.array_equal(again, t1)
    again[:] = np.iinfo(np.int64).max  # (what a recorder fills a call's result with)
    assert np.array_equal(K.rnn_weight_table(ws[:2], ws[2:], 24, 1, True), t1)
    copy = pgemm.packed_weight(ws[0], True, pgemm.PACKED_MIN_ROWS)
    assert t1[4, 0] == copy.ctypes.data and t1[0, 0] == ws[0].ctypes.data
    params.written([ws[0]])  # packed again at the next ask
    t2 = K.rnn_weight_table(ws[:2], ws[2:], 24, 1, True)
    assert K._TABLES[key][2] is not kept
    kept = K._TABLES[key][2]
    assert t2[4, 0] == pgemm.packed_weight(ws[0], True, pgemm.PACKED_MIN_ROWS).ctypes.data
    before = set(K._TABLES)
    others = [w.copy() for w in ws]
    t3 = K.rnn_weight_table(others[:2], others[2:], 24, 1, True)
    assert t3 is not t2 and t3[0, 0] == others[0].ctypes.data
    (gone,) = set(K._TABLES) - before
    del others, t3
    gc.collect()
    # (its entry gone; the tables of arrays that stay, kept: other tests' may go meanwhile)
    assert gone not in K._TABLES
    assert np.array_equal(K.rnn_weight_table(ws[:2], ws[2:], 24, 1, True), t2)
    assert K._TABLES[key][2] is kept
