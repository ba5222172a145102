"""Recurrent kernels: the time loops of the ``rnn`` op (LSTM, GRU, simple RNN; stacked layers,
both directions, sequence lengths) and its gradient.

Every size is a run-time argument: one compilation per dtype serves every mode, shape and
stack. Data is time-major: ``x`` ``(T, B, I)``, states ``(L * D, B, H)``. The weights are in
Paddle's order (all ``w_ih, w_hh`` per layer and direction, then all ``b_ih, b_hh``), a weight
``w_ih`` being ``(G * H, I_l)`` with ``G`` gates per cell: the forward reads them where they
lie, through a table of their addresses and sizes (:func:`rnn_weight_table`: no copy of the
WeightList per run, which for a 2-layer bidirectional LSTM of 256 hidden was 9 MB and 0.8 ms);
:func:`rnn_forward` and the backward take them flattened into one array ``w``. ``mode``: 0
LSTM (gates i, f, c~, o), 1 GRU (r, z, c~), 2 RNN_TANH, 3 RNN_RELU. ``lens`` (int64, ``(B,)``,
or empty: every sequence has ``T`` steps): steps at or past a sequence's length leave its state
unchanged and write zeros to the output.

Per layer and direction the forward kernel projects the input of *all* steps with one GEMM (the
biases folded in), then runs the time loop. Where the table holds the matrices packed
transposed (:func:`rnn_weight_table`: copies kept from run to run where no op writes the
weights, else packed at each run where that pays), both products run on pdjit's GEMM
(:mod:`.pgemm`): the projection with the biases as its epilogue, a step's ``W_hh h`` into rows
of sequences (one sequence: :func:`pgemm.packed_vector`). Measured (float32, one core, an
AVX-512 AMD EPYC whose OpenBLAS runs its Haswell kernel): 1024 x 512 by 1024 rows 4.2 ms packed
against 8.4 by BLAS; ``W_hh`` 1024 x 256 by 16 sequences 37 us against 40 on the tiles below,
by one 9.0 against 11.7, 384 x 128 by one 1.5 against 2.3; an LSTM classifier (2 bidirectional
layers of 256 over 64 steps) at batch 1 4.45 -> 2.75 ms, 16 35.3 -> 22.8 ms. Otherwise the
projection is one BLAS call (``np.dot``) and a step's ``W_hh h`` lands in ``hht`` ``(G*H,
sequences)``: from :data:`TILE_MIN_BATCH` sequences on register tiles (``tile_kernel``: 28 rows
of ``W_hh`` by one vector of sequences, each weight read once per vector and broadcast); for
one sequence a matrix-vector product streaming a vector's worth of rows of ``W_hh`` side by
side (:func:`_gemv_kernel`); for 2-3 sequences one BLAS call. Either way
``xp + W_hh h`` then goes into each sequence's gate row
(in blocks of 16 gates, the columns of ``hht`` read while in cache) and the gate arithmetic runs
per sequence in loops over the row that vectorise (``pdjit.codegen.cpu.mathfuncs``; float32
data is computed in float32; LSTM's and GRU's loops are written out in the time loop with
unsigned indices: Numba's negative-index wraparound and the call of a row function kept them
scalar, ~3x slower). The backward kernel runs the steps in reverse, keeping the gradients of
the gate pre-activations, and ends with GEMMs over all steps for the weight and input
gradients (the input's skipped when nothing reads it). Where packing pays (as in the
forward), these and each step's product by ``W_hh`` run on pdjit's GEMM: the weights packed
once a call, a weight gradient ``dW += dG^T X`` with ``dG^T`` packed and ``X`` read in place
(:func:`pgemm.pointwise_rows`), each sum stored over what it adds to. Measured
(``bench_sequence_models.py --only lstm``: forward and backward, batch 32, 50 steps, 128 by
128): 6.6-6.9 -> 3.9-4.4 ms on two threads, 11.4 -> 6.8-7.0 on one.

Sequences are independent: :func:`rnn_forward` / :func:`rnn_backward` split a large batch into
slices, one per loop thread (each slice runs every layer and direction, its BLAS calls on one
thread; the backward's slices keep weight gradients of their own, summed at the end).
Measured (float32, LSTM, batch 32, 50 steps, 128 inputs, 128 hidden, 2 cores, quiet): one
slice forward 5.8 ms, backward 8.5 ms (no input gradient), mostly GEMMs; two slices on two
threads 3.2 + 4.9 ms. (With another process busy on the second core, two slices are slower
than one: each waits for the slower.) A bidirectional network's forward runs the two
directions of each layer at once instead (each on the whole batch; on slices of it from four
threads), one hand-over a layer, unless a layer's dropout needs both directions done first:
an LSTM classifier (2 bidirectional layers of 256 over 64 steps of 128) on two threads, batch
1 5.31 -> 3.85 ms, batch 16 37.2 -> 27.8 (where its slices of the batch ran every direction).

``reserve`` (the op's ``Reserve`` viewed as the data's dtype) keeps what the gradient needs;
per layer ``l`` and direction ``d`` (``k = l * D + d``, blocks in that order) a block of
``T * B * (G + 2) * H`` values: the activated gates ``(T, B, G*H)`` (LSTM i, f, c~, o; GRU r, z,
c~; simple RNN the new state), the state before each step ``(T, B, H)`` and an auxiliary
``(T, B, H)`` (LSTM: the cell before the step; GRU: ``W_hc h + b_hc``); then, for the layers
but the last, their outputs ``(T, B, D*H)`` as the next layer read them (after dropout).
"""
import weakref

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, overload, register_jitable

from pdjit.codegen.cpu import mathfuncs as _m
from pdjit.codegen.cpu.lib import pgemm as _pg
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jobs, pjit
from pdjit.codegen.cpu.lib.tile import (
    TILE_BYTES,
    _offset,
    _vectors,
    sum_passes,
    tile_kernel,
)
from pdjit.codegen.cpu.threads import asked_threads, free_cores, loop_threads, run_parts

__all__ = ["rnn_forward", "rnn_forward_at", "rnn_weight_table", "rnn_backward", "rnn_gates",
           "rnn_reserve_size"]

LSTM, GRU, RNN_TANH, RNN_RELU = 0, 1, 2, 3
U = numba.uint64


@jit
def rnn_gates(mode):
    """The number of gates of a cell of ``mode``."""
    if mode == LSTM:
        return 4
    if mode == GRU:
        return 3
    return 1


@jit
def rnn_reserve_size(mode, seq, batch, hidden, num_layers, ndir):
    """Values ``reserve`` holds for these sizes (see the module's docstring)."""
    g = rnn_gates(mode)
    return (num_layers * ndir * seq * batch * (g + 2) * hidden
            + (num_layers - 1) * seq * batch * ndir * hidden)


@jit
def _fold_bias(xp, bih, bhh, mode, H):
    """``xp += b_ih + b_hh`` per row (GRU: ``b_hh`` of r and z only; its c~ part goes inside
    ``r * (W_hc h + b_hc)``)."""
    n = U(xp.shape[1] if mode != GRU else 2 * H)
    for r in range(xp.shape[0]):
        row = xp[r]
        for q in range(n):
            row[q] += bih[q] + bhh[q]
        for q in range(n, U(xp.shape[1])):
            row[q] += bih[q]


# One step of one sequence (a row), one loop per gate: the branch-free ``mathfuncs`` helpers
# let the loops vectorise (libm's scalar exp/tanh took two thirds of the forward's time)
@jit
def _fwd_row(mode, ab, hb, bhh, h, c, g, prow, arow, yrow, col, one):
    """``ab``: the step's input projection with the biases, ``hb``: the hidden projection
    (``G*H`` each); updates the state ``h`` (and cell ``c``) in place, writes the activated
    gates ``g``, the state before ``prow``, the auxiliary ``arow`` and ``yrow[col:col+H]``."""
    H = h.shape[0]
    zero = one - one
    if mode == LSTM:
        for q in range(4 * H):
            g[q] = ab[q] + hb[q]
        for q in range(2 * H):
            g[q] = _m.sigmoid(g[q])
        for q in range(2 * H, 3 * H):
            g[q] = _m.tanh(g[q])
        for q in range(3 * H, 4 * H):
            g[q] = _m.sigmoid(g[q])
        for j in range(H):
            cp = c[j]
            prow[j] = h[j]
            arow[j] = cp
            cn = g[H + j] * cp + g[j] * g[2 * H + j]
            c[j] = cn
            hn = g[3 * H + j] * _m.tanh(cn)
            h[j] = hn
            yrow[col + j] = hn
    elif mode == GRU:
        for q in range(2 * H):
            g[q] = _m.sigmoid(ab[q] + hb[q])
        for j in range(H):
            hc = hb[2 * H + j] + bhh[2 * H + j]
            arow[j] = hc
            g[2 * H + j] = _m.tanh(ab[2 * H + j] + g[j] * hc)
        for j in range(H):
            hp = h[j]
            prow[j] = hp
            z = g[H + j]
            hn = z * hp + (one - z) * g[2 * H + j]
            h[j] = hn
            yrow[col + j] = hn
    else:
        for j in range(H):
            prow[j] = h[j]
            arow[j] = zero
            g[j] = ab[j] + hb[j]
        if mode == RNN_TANH:
            for j in range(H):
                g[j] = _m.tanh(g[j])
        else:
            for j in range(H):
                v = g[j]
                g[j] = v if v > zero else zero
        for j in range(H):
            h[j] = g[j]
            yrow[col + j] = g[j]


@jit
def _bwd_row(mode, g, prow, arow, dyrow, col, dh, dc, dxr, dhr, one):
    """The gradients of one :func:`_fwd_row`: from ``dh`` (+ ``dyrow[col:col+H]``) and ``dc``
    (the gradients of the state after), writes those of the pre-activations, ``dxr`` (input
    side) and ``dhr`` (hidden side; GRU only, else the same array), and leaves in ``dh``/``dc``
    the parts that reach the state before directly (the GEMM with ``W_hh`` adds the rest)."""
    H = dh.shape[0]
    zero = one - one
    if mode == LSTM:
        for j in range(H):
            gy = dh[j] + dyrow[col + j]
            gi, gf, gc, go = g[j], g[H + j], g[2 * H + j], g[3 * H + j]
            cp = arow[j]
            tc = _m.tanh(gf * cp + gi * gc)
            dcs = dc[j] + gy * go * (one - tc * tc)
            dxr[j] = dcs * gc * gi * (one - gi)
            dxr[H + j] = dcs * cp * gf * (one - gf)
            dxr[2 * H + j] = dcs * gi * (one - gc * gc)
            dxr[3 * H + j] = gy * tc * go * (one - go)
            dc[j] = dcs * gf
            dh[j] = zero
    elif mode == GRU:
        for j in range(H):
            gy = dh[j] + dyrow[col + j]
            r, z, cand = g[j], g[H + j], g[2 * H + j]
            dac = gy * (one - z) * (one - cand * cand)
            dar = dac * arow[j] * r * (one - r)
            daz = gy * (prow[j] - cand) * z * (one - z)
            dxr[j] = dar
            dxr[H + j] = daz
            dxr[2 * H + j] = dac
            dhr[j] = dar
            dhr[H + j] = daz
            dhr[2 * H + j] = dac * r
            dh[j] = gy * z
    elif mode == RNN_TANH:
        for j in range(H):
            hv = g[j]
            dxr[j] = (dh[j] + dyrow[col + j]) * (one - hv * hv)
            dh[j] = zero
    else:
        for j in range(H):
            gy = dh[j] + dyrow[col + j]
            dxr[j] = gy if g[j] > zero else zero
            dh[j] = zero


@jit
def _offsets(mode, in_size, hidden, num_layers, ndir):
    """Start of ``w_ih``, ``w_hh``, ``b_ih``, ``b_hh`` of each ``(layer, direction)`` in ``w``,
    and the input size of each layer."""
    gh = rnn_gates(mode) * hidden
    k_all = num_layers * ndir
    offs = np.empty((k_all, 4), np.int64)
    sizes = np.empty(num_layers, np.int64)
    pos = 0
    for layer in range(num_layers):
        il = in_size if layer == 0 else ndir * hidden
        sizes[layer] = il
        for d in range(ndir):
            k = layer * ndir + d
            offs[k, 0] = pos
            pos += gh * il
            offs[k, 1] = pos
            pos += gh * hidden
    for k in range(k_all):
        offs[k, 2] = pos
        pos += gh
        offs[k, 3] = pos
        pos += gh
    return offs, sizes, pos


# ---- the weights where they lie: an address table -----------------------------------------
@intrinsic
def _pointer(typingctx, addr, like):
    """A pointer to ``like``'s element type at the integer address ``addr``."""
    if not isinstance(addr, types.Integer) or not isinstance(like, types.Array):
        return None
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(addr, like), codegen


@jit
def _weight_at(wt, i, n, like):
    """Weight ``i`` of the table ``wt`` (rows ``(address, size)``, see
    :func:`rnn_weight_table`) as a 1-D array of ``like``'s dtype, its size checked to be
    ``n``."""
    if wt[i, 1] != n:
        raise ValueError("pdjit: rnn_forward: a weight of WeightList has the wrong size")
    return numba.carray(_pointer(wt[i, 0], like), (n,))


@register_jitable
def _holds_packed(wt, num_layers, ndir):
    """Whether the weight table ``wt`` holds the matrices packed transposed after the
    WeightList's rows (:func:`rnn_weight_table`), or not."""
    return wt.shape[0] >= 6 * num_layers * ndir


@jit
def _packed_at(wt, i, k, n, like):
    """Row ``i`` of the table ``wt`` where it has one: the right operand ``[k, n]`` of a
    product packed into panels (:func:`pdjit.codegen.cpu.lib.pgemm.pack_b`), its size
    checked; else an empty array (not packed)."""
    if i >= wt.shape[0]:
        return np.empty(0, like.dtype)
    if wt[i, 1] != _pg.packed_b_size(k, n, like.itemsize):
        raise ValueError("pdjit: rnn_forward: a packed weight has the wrong size")
    return numba.carray(_pointer(wt[i, 0], like), (wt[i, 1],))


@jit
def _table_of(weights, biases, packed):
    """The rows of :func:`rnn_weight_table` (tuples of C-contiguous arrays of one dtype; the
    rows of ``packed`` last)."""
    table = np.empty((len(weights) + len(biases) + packed.shape[0], 2), np.int64)
    i = 0
    for a in weights:
        if not a.flags.c_contiguous:
            raise ValueError("pdjit: rnn_weight_table: a weight is not C-contiguous")
        table[i, 0] = a.ctypes.data
        table[i, 1] = a.size
        i += 1
    for a in biases:
        if not a.flags.c_contiguous:
            raise ValueError("pdjit: rnn_weight_table: a bias is not C-contiguous")
        table[i, 0] = a.ctypes.data
        table[i, 1] = a.size
        i += 1
    table[i:] = packed
    return table


#: the matrices are packed at each run (a training run writes them; compiled code keeps no
#: copy) where ``steps * (sequences + 2)`` is at least this. A product by a weight packed
#: transposed gains ~8e-3 ns a row and value (float32, one core: 250 against 125 GFLOP/s of
#: BLAS), a step of one sequence on a packed ``W_hh`` ~1.7e-2 ns a value (and of 4-16 ~1-4e-2),
#: the packing costs 0.3-0.4 ns a value: a GRU of 128 over 32 steps of one sequence gains 36
#: us a run for 21 us of packing
PACK_EVERY_RUN_MIN = 96


@register_jitable
def _pays_every_run(steps, batch):
    return steps * (batch + 2) >= PACK_EVERY_RUN_MIN


def rnn_weight_table(weights, biases, steps=0, batch=0, kept=False):
    """The ``(address, size)`` rows (int64) of the arrays of a WeightList, in its order: the
    2-D ``w_ih, w_hh`` of every layer and direction (``weights``), then the 1-D ``b_ih, b_hh``
    (``biases``). :func:`rnn_forward_at` reads the weights there, in place: no copy of them
    per run. Every array must be C-contiguous and of one float dtype, and stay alive while
    the table is used (the caller holds them).

    Then, for a run of ``steps`` steps of ``batch`` sequences, the rows of the matrices
    packed transposed for pdjit's GEMM (:func:`pdjit.codegen.cpu.lib.pgemm.packed_weight`,
    kept beside each array, which holds the copy alive, until a run may write it), which
    the forward then runs on: always where the copies are ``kept`` from run to run (no op of
    the program writes the weights), else where packing at each run pays
    (:data:`PACK_EVERY_RUN_MIN`). Compiled code packs into the table itself, after its
    rows (it keeps no copies).

    The table is made once for the same arrays and handed out as a copy of its own to each
    caller (a few rows): a caller may write it (a host driver's recorder fills what each call
    returned with NaN before checking a replay) without changing what the next call gets."""
    weights, biases = tuple(weights), tuple(biases)
    arrays = weights + biases
    packs = bool(weights) and bool(kept or _pays_every_run(steps, batch))
    key = (tuple(map(id, arrays)), packs)
    kept_table = _TABLES.get(key)
    if kept_table is not None:  # (the same arrays, and the same packed copies of them)
        refs, copies, table = kept_table
        if all(r() is a for r, a in zip(refs, arrays)) and \
                all(_pg.packed_weight(w, True, _pg.PACKED_MIN_ROWS) is c
                    for w, c in zip(weights, copies)):
            return table.copy()
    dt = arrays[0].dtype if arrays else None
    for i, a in enumerate(arrays):
        if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous \
                or a.ndim != (2 if i < len(weights) else 1):
            raise ValueError(f"pdjit: rnn_weight_table: WeightList[{i}] is not a C-contiguous "
                             f"{'2' if i < len(weights) else '1'}-D array of the dtype of the "
                             f"others ({dt})")
    copies = [_pg.packed_weight(w, True, _pg.PACKED_MIN_ROWS) for w in weights] if packs \
        else []
    packed = np.empty((len(copies), 2), np.int64)
    for i, p in enumerate(copies):
        packed[i] = p.ctypes.data, p.size
    table = _table_of(weights, biases, packed)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.clear()
    gone = _forget(key)
    _TABLES[key] = (tuple(weakref.ref(a, gone) for a in arrays), copies, table)
    return table.copy()


#: the tables :func:`rnn_weight_table` made, kept while their arrays and packed copies are the
#: ones they name, dropped when one of the arrays goes (a GRU classifier's run at batch 1
#: spent ~7 us of its ~84 making its table again): (ids of the arrays, whether packed) ->
#: (weak references to the arrays, the packed copies, the table)
_TABLES: dict = {}
_MAX_TABLES = 256


def _forget(key):
    def drop(ref, key=key):
        entry = _TABLES.get(key)
        if entry is not None and ref in entry[0]:
            _TABLES.pop(key, None)
    return drop


@overload(rnn_weight_table, jit_options={"nogil": True})
def _rnn_weight_table_native(weights, biases, steps=0, batch=0, kept=False):
    def table_of(weights, biases, steps=0, batch=0, kept=False):
        n = len(weights)
        if n == 0 or not _pays_every_run(steps, batch):
            return _table_of(weights, biases, np.empty((0, 2), np.int64))
        values = 0
        for w in weights:
            values += _pg.packed_b_size(w.shape[1], w.shape[0], w.itemsize)
        head = 2 * n + len(biases)
        # the packed copies after the rows (a row is 16 bytes: 4 more rows align them to 64)
        table = np.empty((head + 4 + (values * weights[0].itemsize + 15) // 16, 2), np.int64)
        table[:n + len(biases)] = _table_of(weights, biases, np.empty((0, 2), np.int64))
        pos = (table.ctypes.data + head * 16 + 63) // 64 * 64
        i = n + len(biases)
        for w in weights:
            size = _pg.packed_b_size(w.shape[1], w.shape[0], w.itemsize)
            _pg.pack_scaled(w, True, 1.0, numba.carray(_pointer(pos, w), (size,)))
            table[i, 0] = pos
            table[i, 1] = size
            pos += size * w.itemsize
            i += 1
        return table
    return table_of


# ---- the recurrent product of a step on register tiles ---------------------------------------
#: rows of W_hh per tile (their sums, one vector of sequences each, stay in vector registers)
_TILE_ROWS = 28
_tile_big, _tile_mid, _tile_one = tile_kernel(_TILE_ROWS, 1), tile_kernel(8, 1), \
    tile_kernel(1, 1)
#: the batch (of a slice) from which a step's ``W_hh h`` runs on the tiles, below which one
#: BLAS call (a matrix-vector product for one sequence; a vector of sequences wastes lanes)
TILE_MIN_BATCH = 4


@jit
def _step_tiles(whf, GH, H, hT, tap, hht, BP, nch, lanes):
    """``hht[:GH, :] = W_hh @ hT``: ``whf`` the ``(GH, H)`` weights flat, ``hT`` ``(H, BP)`` the
    states of the slice's sequences by columns (the columns past them zero), ``BP = nch *
    lanes``; tiles of rows of ``W_hh`` by one vector of ``lanes`` sequences, each weight read
    once per vector of sequences and broadcast."""
    hf = hT.reshape(H * BP)
    of = hht.reshape(GH * BP)
    for c in range(nch):
        q0 = c * lanes
        n = 0
        while n + _TILE_ROWS <= GH:
            _tile_big(whf, n * H, H, H, hf, 0, tap, 0, of, n * BP, BP, q0, False)
            n += _TILE_ROWS
        while n + 8 <= GH:
            _tile_mid(whf, n * H, H, H, hf, 0, tap, 0, of, n * BP, BP, q0, False)
            n += 8
        while n < GH:
            _tile_one(whf, n * H, H, H, hf, 0, tap, 0, of, n * BP, BP, q0, False)
            n += 1


# ---- the recurrent product of one sequence: rows of W_hh against h --------------------------
def _gemv_kernel(rows: int):
    """``out[o0 + r] = sum over k < kv * lanes of w[w0 + r * ld + k] * h[k]`` for ``r <
    rows`` (a vector: :data:`TILE_BYTES`; ``rows=0``: as many rows as a vector has lanes):
    each row's products in a vector register, the rows streaming side by side, each weight
    read once. A vector's worth of rows is summed across lanes in a tree of shuffles that
    leaves the row sums in one vector, stored at once (a reduction per row cost as much as
    the products at a hidden size of 256); fewer rows are each reduced. LLVM IR, as
    :mod:`pdjit.codegen.cpu.lib.tile`'s tiles (offsets kept in bounds by the caller)."""
    @intrinsic
    def gemv(typingctx, w, w0, ld, kv, h, out, o0):
        if not all(isinstance(a, types.Array) for a in (w, h, out)) or \
                not w.dtype == h.dtype == out.dtype or w.dtype not in (types.float32,
                                                                       types.float64):
            return None

        def codegen(context, builder, signature, args):
            at = signature.args
            wptr, hptr, optr = (context.make_array(at[i])(context, builder, args[i]).data
                                for i in (0, 4, 5))
            w0v, ldv, kvv, o0v = (_offset(context, builder, at[i], args[i])
                                  for i in (1, 2, 3, 6))
            fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
            nrows = rows or lanes
            acc = [cgutils.alloca_once_value(builder, zero) for _ in range(nrows)]
            starts = [builder.add(w0v, builder.mul(ldv, ir.Constant(i64, r)))
                      for r in range(nrows)]
            for r0, r1, _, _ in sum_passes(nrows, 1):  # (rows that fit the registers)
                with cgutils.for_range(builder, kvv) as loop:
                    k = builder.mul(loop.index, ir.Constant(i64, lanes))
                    hv = builder.load(builder.bitcast(builder.gep(hptr, [k]),
                                                      vty.as_pointer()), align=size)
                    for r in range(r0, r1):
                        p = builder.bitcast(builder.gep(wptr, [builder.add(starts[r], k)]),
                                            vty.as_pointer())
                        builder.store(builder.call(fma, [builder.load(p, align=size), hv,
                                                         builder.load(acc[r])]), acc[r])
            sums = [builder.load(a) for a in acc]
            if not rows:
                # each level halves the partial sums of every row: x's rows then y's, each
                # with its first half of partials (lo) plus its second half (hi)
                i32 = ir.IntType(32)
                part = lanes
                while part > 1:
                    half = part // 2
                    lo = [base + seg * part + i for base in (0, lanes)
                          for seg in range(lanes // part) for i in range(half)]
                    hi = [j + half for j in lo]
                    merged = []
                    for x, y in zip(sums[0::2], sums[1::2]):
                        a = builder.shuffle_vector(x, y, ir.Constant(
                            ir.VectorType(i32, lanes), lo))
                        b = builder.shuffle_vector(x, y, ir.Constant(
                            ir.VectorType(i32, lanes), hi))
                        merged.append(builder.fadd(a, b))
                    sums, part = merged, half
                p = builder.bitcast(builder.gep(optr, [o0v]), vty.as_pointer())
                builder.store(sums[0], p, align=size)
                return context.get_dummy_value()
            kind = "f32" if size == 4 else "f64"
            reduce = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(fty, [fty, vty]),
                f"llvm.vector.reduce.fadd.v{lanes}{kind}")
            for r in range(nrows):
                total = builder.call(reduce, [ir.Constant(fty, 0.0), sums[r]],
                                     fastmath=("reassoc",))
                builder.store(total, builder.gep(optr, [builder.add(o0v, ir.Constant(i64, r))]))
            return context.get_dummy_value()

        return types.void(w, w0, ld, kv, h, out, o0), codegen

    return gemv


_gemv_lanes, _gemv4, _gemv1 = _gemv_kernel(0), _gemv_kernel(4), _gemv_kernel(1)


@jit
def _step_gemv(whf, GH, H, h, out, lanes):
    """``out[:GH] = W_hh @ h`` for one sequence (``whf`` the ``(GH, H)`` weights flat)."""
    kv = H // lanes
    n = 0
    while n + lanes <= GH:
        _gemv_lanes(whf, n * H, H, kv, h, out, n)
        n += lanes
    while n + 4 <= GH:
        _gemv4(whf, n * H, H, kv, h, out, n)
        n += 4
    while n < GH:
        _gemv1(whf, n * H, H, kv, h, out, n)
        n += 1
    for r in range(GH):  # the columns past the whole vectors
        acc = out[r]
        for k in range(kv * lanes, H):
            acc += whf[r * H + k] * h[k]
        out[r] = acc


@by_address
@jit
def _fwd_part(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
              out, hn, cn, reserve, b0, b1, l0, l1, d0, d1, mid):
    """:func:`rnn_forward_at` for the sequences ``b0 .. b1`` (independent of the others: each
    slice can run on a thread of its own; it writes only its rows of ``out``, ``hn``, ``cn``
    and ``reserve``), the layers ``l0 .. l1`` and of each the directions ``d0 .. d1`` (the
    directions of a layer are independent too, given the layer's input: each writes its own
    columns of the layer's output and its own rows of ``hn``, ``cn`` and ``reserve``; a
    layer after the first reads the output of the one before, from ``reserve`` or ``mid``).
    ``mid`` ``(2, T, B, D*H)``: the outputs of the layers but the last where ``reserve`` does
    not hold them, layer ``l`` in ``mid[l % 2]``; empty: made here (then ``l0`` is 0)."""
    T, B, I = x.shape
    H = h0.shape[2]
    L, D = num_layers, ndir
    G = rnn_gates(mode)
    GH = G * H
    DH = D * H
    Bs = b1 - b0
    Hu = U(H)
    offs, sizes, total = _offsets(mode, I, H, L, D)
    packed = _holds_packed(wt, L, D)
    if (not packed and wt.shape[0] != 4 * L * D or wt.shape[1] != 2 or h0.shape[0] != L * D
            or h0.shape[1] != B or hn.shape != h0.shape
            or out.shape != (T, B, DH) or (lens.size != 0 and lens.size != B)
            or b0 < 0 or b1 > B or b0 > b1):
        raise ValueError("pdjit: rnn_forward: the arrays do not fit the sizes")
    if mode == LSTM and (c0.shape != h0.shape or cn.shape != h0.shape):
        raise ValueError("pdjit: rnn_forward: the cell states do not fit the sizes")
    if l0 < 0 or l1 > L or d0 < 0 or d1 > D or mid.size != 0 and \
            (mid.shape[0] != 2 or mid.shape[1] != T or mid.shape[2] != B or
             mid.shape[3] != DH) or l0 > 0 and mid.size == 0 and not save:
        raise ValueError("pdjit: rnn_forward: the layers asked for do not fit the sizes")
    block = T * B * (GH + 2 * H)
    lay0 = L * D * block
    if save and reserve.size < rnn_reserve_size(mode, T, B, H, L, D):
        raise ValueError("pdjit: rnn_forward: Reserve is too small")
    dropping = drop_mask.size != 0
    one = np.ones(1, x.dtype)[0]  # typed constants: float32 data stays float32
    zero = one - one
    # W_hh h of a step: with W_hh packed transposed, on pdjit's GEMM (one sequence: one row's
    # tiles) into hrows (Bs, GH); else on register tiles (columns of sequences, padded to
    # whole vectors) or, for a small slice, one BLAS call, into hht (GH, BP)
    hrows = np.empty((Bs if packed else 0, GH), x.dtype)
    nob = np.empty(0, x.dtype)
    tiled = Bs >= TILE_MIN_BATCH and not packed
    lanes = TILE_BYTES // x.itemsize
    nch = (Bs + lanes - 1) // lanes if tiled else 1
    BP = nch * lanes if tiled else Bs
    hT = np.zeros((H, BP if tiled else 0), x.dtype)
    tap = np.arange(H) * BP
    hht = np.empty((0 if packed else GH, BP), x.dtype)
    hrow = np.empty(GH, x.dtype)
    # the slice's inputs as contiguous rows (a copy unless the slice is the whole batch)
    if l0 == 0:
        inp = np.ascontiguousarray(x[:, b0:b1, :]).reshape((T * Bs, I))
    else:  # (the output of the layer before: dropped out already)
        before = mid[(l0 - 1) % 2] if not save else reserve[
            lay0 + (l0 - 1) * T * B * DH:lay0 + l0 * T * B * DH].reshape((T, B, DH))
        inp = np.ascontiguousarray(before[:, b0:b1, :]).reshape((T * Bs, DH))
    for layer in range(l0, l1):
        il = sizes[layer]
        last = layer == L - 1
        if last:
            y = out
        elif save:
            y = reserve[lay0 + layer * T * B * DH:lay0 + (layer + 1) * T * B * DH].reshape(
                (T, B, DH))
        elif mid.size != 0:
            y = mid[layer % 2]
        else:
            y = np.empty((T, B, DH), x.dtype)
        for d in range(d0, d1):
            k = layer * D + d
            wih = _weight_at(wt, 2 * k, GH * il, x).reshape((GH, il))
            whf = _weight_at(wt, 2 * k + 1, GH * H, x)
            whh = whf.reshape((GH, H))
            bih = _weight_at(wt, 2 * L * D + 2 * k, GH, x)
            bhh = _weight_at(wt, 2 * L * D + 2 * k + 1, GH, x)
            if save:
                blk = reserve[k * block:(k + 1) * block]
                gates = blk[:T * B * GH].reshape((T, B, GH))
                hprev = blk[T * B * GH:T * B * (GH + H)].reshape((T, B, H))
                aux = blk[T * B * (GH + H):].reshape((T, B, H))
            else:
                gates = np.empty((1, B, GH), x.dtype)
                hprev = np.empty((1, B, H), x.dtype)
                aux = np.empty((1, B, H), x.dtype)
            whhp = _packed_at(wt, 4 * L * D + 2 * k + 1, H, GH, x)
            if packed:  # every step's input projection: one GEMM, the biases its epilogue
                fb = np.zeros((1, GH), x.dtype)
                _fold_bias(fb, bih, bhh, mode, H)
                xp = np.empty((T * Bs, GH), x.dtype)
                _pg._packed_rows(inp, _packed_at(wt, 4 * L * D + 2 * k, il, GH, x), GH,
                                 fb.reshape(GH), xp, 0, T * Bs, nob, -np.inf, np.inf)
            else:
                xp = np.dot(inp, wih.T)
                _fold_bias(xp, bih, bhh, mode, H)
            xp3 = xp.reshape((T, Bs, GH))
            h = h0[k, b0:b1].copy()
            c = c0[k, b0:b1].copy() if mode == LSTM else h0[k, b0:b1].copy()
            for s in range(T):
                t = s if d == 0 else T - 1 - s
                ts = t if save else 0
                if packed:
                    if Bs == 1:
                        _pg.packed_vector(h[0], whhp, GH, nob, hrows[0])
                    else:
                        _pg._packed_rows(h, whhp, GH, nob, hrows, 0, Bs, nob, -np.inf, np.inf)
                elif tiled:
                    for j in range(H):
                        hTr = hT[j]
                        for bl in range(Bs):
                            hTr[bl] = h[bl, j]
                    _step_tiles(whf, GH, H, hT, tap, hht, BP, nch, lanes)
                elif Bs == 1:
                    _step_gemv(whf, GH, H, h[0], hht.reshape(GH), lanes)
                else:
                    # (G*H, H) x (H, B): faster than (B, H) x (H, G*H) for a small batch
                    np.dot(whh, h.T, hht)
                if mode == LSTM or mode == GRU:
                    # the pre-activations xp + W_hh h (GRU: of r and z; its W_hc h + b_hc
                    # into aux) into the gate rows, hht's (gate, sequence) layout read in
                    # blocks of 16 gates that stay in the L1 cache
                    nsum = U(GH) if mode == LSTM else U(2) * Hu
                    if packed:
                        for bl in range(Bs):
                            gb, ab, hv = gates[ts, b0 + bl], xp3[t, bl], hrows[bl]
                            for q in range(nsum):
                                gb[q] = ab[q] + hv[q]
                            if mode == GRU:
                                ar = aux[ts, b0 + bl]
                                for j in range(Hu):
                                    ar[j] = hv[U(2) * Hu + j] + bhh[U(2) * Hu + j]
                    elif Bs == 1:  # one column: a row
                        gb, ab, hv = gates[ts, b0], xp3[t, 0], hht.reshape(GH)
                        for q in range(nsum):
                            gb[q] = ab[q] + hv[q]
                    else:
                        for q0 in range(U(0), nsum, U(16)):
                            q1 = min(q0 + U(16), nsum)
                            for bl in range(Bs):
                                gb, ab = gates[ts, b0 + bl], xp3[t, bl]
                                for q in range(q0, q1):
                                    gb[q] = ab[q] + hht[q, bl]
                    if mode == GRU and not packed:
                        for q0 in range(U(0), Hu, U(16)):
                            q1 = min(q0 + U(16), Hu)
                            for bl in range(Bs):
                                ar = aux[ts, b0 + bl]
                                for j in range(q0, q1):
                                    ar[j] = hht[U(2) * Hu + j, bl] + bhh[U(2) * Hu + j]
                for bl in range(Bs):
                    b = b0 + bl
                    if lens.size != 0 and t >= lens[b]:
                        y[t, b, d * H:(d + 1) * H] = zero
                        gates[ts, b, :] = zero
                        hprev[ts, b, :] = h[bl]
                        aux[ts, b, :] = zero
                        continue
                    # LSTM and GRU written out here with unsigned indices (no negative-index
                    # wraparound): the loops vectorise (~3x faster than through _fwd_row)
                    gb, ab = gates[ts, b], xp3[t, bl]
                    hr, pr, ar = h[bl], hprev[ts, b], aux[ts, b]
                    yr = y[t, b, d * H:(d + 1) * H]
                    if mode == LSTM:
                        for q in range(U(2) * Hu):
                            gb[q] = _m.sigmoid(gb[q])
                        for q in range(U(2) * Hu, U(3) * Hu):
                            gb[q] = _m.tanh(gb[q])
                        for q in range(U(3) * Hu, U(4) * Hu):
                            gb[q] = _m.sigmoid(gb[q])
                        cr = c[bl]
                        for j in range(Hu):
                            cp = cr[j]
                            pr[j] = hr[j]
                            ar[j] = cp
                            cv = gb[Hu + j] * cp + gb[j] * gb[U(2) * Hu + j]
                            cr[j] = cv
                            hv = gb[U(3) * Hu + j] * _m.tanh(cv)
                            hr[j] = hv
                            yr[j] = hv
                    elif mode == GRU:
                        for q in range(U(2) * Hu):
                            gb[q] = _m.sigmoid(gb[q])
                        for j in range(Hu):
                            gb[U(2) * Hu + j] = _m.tanh(ab[U(2) * Hu + j] + gb[j] * ar[j])
                        for j in range(Hu):
                            hp = hr[j]
                            pr[j] = hp
                            z = gb[Hu + j]
                            hv = z * hp + (one - z) * gb[U(2) * Hu + j]
                            hr[j] = hv
                            yr[j] = hv
                    else:
                        for q in range(U(GH)):
                            hrow[q] = hrows[bl, q] if packed else hht[q, bl]
                        _fwd_row(mode, ab, hrow, bhh, hr, c[bl], gb, pr, ar, y[t, b], d * H,
                                 one)
            hn[k, b0:b1] = h
            if mode == LSTM:
                cn[k, b0:b1] = c
        if not last:
            if dropping:
                m = drop_mask[layer * T * B * DH:(layer + 1) * T * B * DH].reshape((T, B, DH))
                for t in range(T):
                    for b in range(b0, b1):
                        yr = y[t, b]
                        mr = m[t, b]
                        for i in range(DH):
                            yr[i] = yr[i] * drop_scale if mr[i] else zero
            inp = np.ascontiguousarray(y[:, b0:b1, :]).reshape((T * Bs, DH))


@register_jitable
def _weight_grad(ap, src, dw):
    """``dw += dY^T @ src`` (``dY^T`` packed into ``ap`` by ``pack_a_of_transpose``; ``src``
    [rows, n], ``dw`` [M, n]): the sum stored over ``dw``."""
    k_, n_ = src.shape
    m_ = dw.shape[0]
    _pg.pointwise_rows(src.reshape((1, k_, n_, 1)), ap, dw.reshape((1, m_, n_, 1)), 0, 1,
                       ap[:0], -np.inf, np.inf, dw.reshape(m_ * n_))


@by_address
@jit
def _bwd_part(x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask, drop_scale,
              dout, dhn, dcn, dx, dh0, dc0, dw, b0, b1):
    """:func:`rnn_backward` for the sequences ``b0 .. b1``: writes their rows of ``dx``
    (skipped when ``dx`` is empty), ``dh0`` and ``dc0``, and *sets* ``dw`` to their part of
    the weight gradients."""
    T, B, I = x.shape
    H = hidden
    L, D = num_layers, ndir
    G = rnn_gates(mode)
    GH = G * H
    DH = D * H
    Bs = b1 - b0
    Hu = U(H)
    offs, sizes, total = _offsets(mode, I, H, L, D)
    if (w.size != total or dw.size != total or dout.shape != (T, B, DH)
            or dhn.shape != (L * D, B, H) or dh0.shape != dhn.shape
            or (dx.size != 0 and dx.shape != x.shape)
            or (lens.size != 0 and lens.size != B)
            or reserve.size < rnn_reserve_size(mode, T, B, H, L, D)
            or b0 < 0 or b1 > B or b0 > b1):
        raise ValueError("pdjit: rnn_backward: the arrays do not fit the sizes")
    if mode == LSTM and (dcn.shape != dhn.shape or dc0.shape != dhn.shape):
        raise ValueError("pdjit: rnn_backward: the cell gradients do not fit the sizes")
    block = T * B * (GH + 2 * H)
    lay0 = L * D * block
    dw[:] = 0.0
    one = np.ones(1, x.dtype)[0]
    zero = one - one
    dy = np.ascontiguousarray(dout[:, b0:b1, :])  # (T, Bs, DH): the slice's rows
    # the products by W_hh (each step) and W_ih (every step's input gradient) on pdjit's GEMM,
    # the weights packed here once, where that pays as in the forward
    packing = _pays_every_run(T, Bs)
    nob = np.empty(0, x.dtype)
    dxp = np.empty((T, Bs, GH), x.dtype)
    dhp = np.empty((T, Bs, GH), x.dtype) if mode == GRU else dxp
    for layer in range(L - 1, -1, -1):
        il = sizes[layer]
        if layer == 0:
            inp = np.ascontiguousarray(x[:, b0:b1, :]).reshape((T * Bs, I))
        else:
            lo = reserve[lay0 + (layer - 1) * T * B * DH:lay0 + layer * T * B * DH].reshape(
                (T, B, DH))
            inp = np.ascontiguousarray(lo[:, b0:b1, :]).reshape((T * Bs, DH))
        need_dinp = layer > 0 or dx.size != 0
        dinp = np.zeros((T * Bs if need_dinp else 0, il), x.dtype)
        for d in range(D):
            k = layer * D + d
            wih = w[offs[k, 0]:offs[k, 0] + GH * il].reshape((GH, il))
            whh = w[offs[k, 1]:offs[k, 1] + GH * H].reshape((GH, H))
            blk = reserve[k * block:(k + 1) * block]
            gates = blk[:T * B * GH].reshape((T, B, GH))
            hprev = blk[T * B * GH:T * B * (GH + H)].reshape((T, B, H))
            aux = blk[T * B * (GH + H):].reshape((T, B, H))
            if lens.size != 0:  # the steps past a length are skipped: zeros there
                dxp[:, :, :] = 0.0
                if mode == GRU:
                    dhp[:, :, :] = 0.0
            dh = dhn[k, b0:b1].copy()
            dc = dcn[k, b0:b1].copy() if mode == LSTM else dhn[k, b0:b1].copy()
            dhs = np.empty((Bs, H), x.dtype)
            whhb = np.empty(_pg.packed_b_size(GH, H, x.itemsize) if packing else 0, x.dtype)
            if packing:
                _pg.pack_b(whh, whhb)
            for s in range(T):
                t = T - 1 - s if d == 0 else s
                for bl in range(Bs):
                    b = b0 + bl
                    if lens.size != 0 and t >= lens[b]:
                        continue  # the state passed through: so does its gradient
                    if mode == LSTM:
                        # written out here with unsigned indices (see the forward)
                        gb, ar, dxr = gates[t, b], aux[t, b], dxp[t, bl]
                        dyr = dy[t, bl, d * H:(d + 1) * H]
                        dhr, dcr = dh[bl], dc[bl]
                        # in passes of one simple loop each: they vectorise (one loop
                        # doing it all did not: 2.6 -> 0.4 ms for 1600 rows of 128)
                        for j in range(Hu):  # the gradient of h after the step
                            dhr[j] = dhr[j] + dyr[j]
                        for j in range(Hu):  # tanh of the cell, kept in o's slot for now
                            dxr[U(3) * Hu + j] = _m.tanh(gb[Hu + j] * ar[j]
                                                         + gb[j] * gb[U(2) * Hu + j])
                        for j in range(Hu):  # the gradient of the cell after the step
                            tc = dxr[U(3) * Hu + j]
                            dcr[j] = dcr[j] + dhr[j] * gb[U(3) * Hu + j] * (one - tc * tc)
                        for j in range(Hu):
                            gi = gb[j]
                            dxr[j] = dcr[j] * gb[U(2) * Hu + j] * gi * (one - gi)
                        for j in range(Hu):
                            gf = gb[Hu + j]
                            dxr[Hu + j] = dcr[j] * ar[j] * gf * (one - gf)
                        for j in range(Hu):
                            gc = gb[U(2) * Hu + j]
                            dxr[U(2) * Hu + j] = dcr[j] * gb[j] * (one - gc * gc)
                        for j in range(Hu):
                            go = gb[U(3) * Hu + j]
                            dxr[U(3) * Hu + j] = dhr[j] * dxr[U(3) * Hu + j] * go * (one - go)
                        for j in range(Hu):  # what reaches the cell before
                            dcr[j] = dcr[j] * gb[Hu + j]
                        for j in range(Hu):  # the GEMM with W_hh adds the rest
                            dhr[j] = zero
                    else:
                        _bwd_row(mode, gates[t, b], hprev[t, b], aux[t, b], dy[t, bl], d * H,
                                 dh[bl], dc[bl], dxp[t, bl], dhp[t, bl], one)
                # (rows past a length are zero there)
                if packing and Bs > 1:  # dh += dhp[t] @ W_hh, the sum stored over dh
                    _pg._packed_rows(dhp[t], whhb, H, nob, dh, 0, Bs, dh.reshape(Bs * H),
                                     -np.inf, np.inf)
                else:
                    if packing:
                        _pg.packed_vector(dhp[t, 0], whhb, H, nob, dhs[0])
                    else:
                        np.dot(dhp[t], whh, dhs)
                    dh += dhs
            dh0[k, b0:b1] = dh
            if mode == LSTM:
                dc0[k, b0:b1] = dc
            # the weight and input gradients of every step at once
            dxp2 = dxp.reshape((T * Bs, GH))
            dhp2 = dhp.reshape((T * Bs, GH))
            hp2 = np.ascontiguousarray(hprev[:, b0:b1, :]).reshape((T * Bs, H))
            dwih = dw[offs[k, 0]:offs[k, 0] + GH * il].reshape((GH, il))
            dwhh = dw[offs[k, 1]:offs[k, 1] + GH * H].reshape((GH, H))
            if packing:  # dW += dXp^T @ X: dXp^T packed, X the right operand in place
                ap = np.empty(_pg.packed_rows_size(GH, T * Bs), x.dtype)
                _pg.pack_a_of_transpose(dxp2, ap)
                _weight_grad(ap, inp, dwih)
                if mode == GRU:  # (else dhp is dxp: packed already)
                    _pg.pack_a_of_transpose(dhp2, ap)
                _weight_grad(ap, hp2, dwhh)
            else:
                dwih += np.dot(dxp2.T, inp)
                dwhh += np.dot(dhp2.T, hp2)
            dbih = dw[offs[k, 2]:offs[k, 2] + GH]
            dbhh = dw[offs[k, 3]:offs[k, 3] + GH]
            for r_ in range(T * Bs):
                xr = dxp2[r_]
                for q in range(U(GH)):
                    dbih[q] += xr[q]
            if mode == GRU:
                for r_ in range(T * Bs):
                    hr_ = dhp2[r_]
                    for q in range(U(GH)):
                        dbhh[q] += hr_[q]
            else:  # the same pre-activations on both sides
                dbhh[:] = dbih
            if need_dinp and packing:  # dinp += dxp2 @ W_ih, the sum stored over dinp
                wihb = np.empty(_pg.packed_b_size(GH, il, x.itemsize), x.dtype)
                _pg.pack_b(wih, wihb)
                _pg._packed_rows(dxp2, wihb, il, nob, dinp, 0, T * Bs,
                                 dinp.reshape(T * Bs * il), -np.inf, np.inf)
            elif need_dinp:
                dinp += np.dot(dxp2, wih)
        if layer == 0:
            if dx.size != 0:
                dx[:, b0:b1, :] = dinp.reshape((T, Bs, I))
        else:
            dy = dinp.reshape((T, Bs, DH))
            if drop_mask.size != 0:
                m = drop_mask[(layer - 1) * T * B * DH:layer * T * B * DH].reshape((T, B, DH))
                for t in range(T):
                    for bl in range(Bs):
                        dr = dy[t, bl]
                        mr = m[t, b0 + bl]
                        for i in range(DH):
                            dr[i] = dr[i] * drop_scale if mr[i] else zero


#: multiply-adds of a call from which its batch is split over the loop threads (measured,
#: LSTM fwd + bwd, 2 cores, one slice vs two: 1.3M 0.13 vs 0.19 ms, 5.2M 0.44 vs 0.38 ms,
#: 10.5M 0.77 vs 0.61 ms, 105M 7.7 vs 3.9 ms)
SPLIT_MIN_WORK = 1 << 22


def _batch_slices(B, threads, itemsize, packed=False):
    """How many slices of a batch of ``B`` sequences the forward runs on ``threads``: fewer
    than :data:`TILE_MIN_BATCH` sequences, one a slice; more, no more slices than the tiles
    their steps run on. With ``W_hh`` packed, pdjit's GEMM: tiles of ``pgemm.MR`` sequences, a
    tile of fewer costing what a whole one does (a GRU classifier, 128 over 32 steps, at batch
    16 on two threads of a 2-vCPU AMD EPYC of the Zen 1 kind: 3.2-3.3 ms in one slice, 2.2-2.5
    ms in two of 8, each two tiles where the batch took three). Else register tiles of a
    vector of sequences (a GRU classifier at batch 16 on two threads took 1.27 ms in two
    slices of 8, each padded to a vector of 16, against 1.04 ms in one)."""
    if B >= TILE_MIN_BATCH:
        B = -(-B // (_pg.MR if packed else TILE_BYTES // itemsize))
    return max(1, min(threads, B))


def _threads(work, parts):
    """How many threads to run a call on (``parts``: as asked; ``None``: when the work is
    large enough, every loop thread, or, unless a thread count was asked for, the cores other
    processes leave free: a part waiting for a busy core holds up the others)."""
    if parts is None:
        parts = 1
        if work >= SPLIT_MIN_WORK:
            parts = loop_threads() if asked_threads() else min(loop_threads(), free_cores())
    return max(1, int(parts))


@jit
def _flat_table(w, mode, in_size, hidden, num_layers, ndir):
    """The :func:`rnn_weight_table` of the weights flattened into ``w`` (C-contiguous)."""
    offs, sizes, total = _offsets(mode, in_size, hidden, num_layers, ndir)
    if w.size != total:
        raise ValueError("pdjit: rnn_forward: the weights do not fit the sizes")
    n = num_layers * ndir
    gh = rnn_gates(mode) * hidden
    table = np.empty((4 * n, 2), np.int64)
    base, item = w.ctypes.data, w.itemsize
    for k in range(n):
        table[2 * k, 0] = base + offs[k, 0] * item
        table[2 * k, 1] = gh * sizes[k // ndir]
        table[2 * k + 1, 0] = base + offs[k, 1] * item
        table[2 * k + 1, 1] = gh * hidden
        table[2 * n + 2 * k, 0] = base + offs[k, 2] * item
        table[2 * n + 2 * k, 1] = gh
        table[2 * n + 2 * k + 1, 0] = base + offs[k, 3] * item
        table[2 * n + 2 * k + 1, 1] = gh
    return table


def rnn_forward(x, h0, c0, w, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
                out, hn, cn, reserve, parts=None):
    """:func:`rnn_forward_at` with the weights flattened into ``w`` (Paddle's order)."""
    w = np.ascontiguousarray(w)
    table = _flat_table(w, mode, x.shape[2], h0.shape[2], num_layers, ndir)
    rnn_forward_at(x, h0, c0, table, lens, mode, num_layers, ndir, save, drop_mask,
                   drop_scale, out, hn, cn, reserve, parts)


def rnn_forward_at(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
                   out, hn, cn, reserve, parts=None):
    """``out`` ``(T, B, D*H)``, last states ``hn`` (and ``cn`` for LSTM; ``c0``/``cn`` are not
    read or written otherwise), and, with ``save``, ``reserve``, from the weights at the
    addresses of the table ``wt`` (:func:`rnn_weight_table`; their sizes checked).
    ``drop_mask`` (uint8, ``(L-1) * T * B * D*H`` or empty: no dropout) scales the outputs of
    the layers but the last by ``mask * drop_scale``. A large batch is split into slices run
    on threads (the sequences are independent); ``parts`` overrides how many."""
    T, B = x.shape[0], x.shape[1]
    H = h0.shape[2]
    G = 4 if mode == LSTM else 3 if mode == GRU else 1
    L, D = num_layers, ndir
    threads = _threads(T * B * G * H * (x.shape[2] + H) * L * D, parts)
    args = (x, h0, c0, wt, lens, mode, L, D, save, drop_mask, drop_scale, out, hn, cn,
            reserve)
    packed = _holds_packed(wt, L, D)
    if D == 2 and threads >= 2 and drop_mask.size == 0:
        # the two directions of each layer at once, each on the whole batch or on slices
        # of it (a layer's dropout, in training, would need both done first: not here)
        n = _batch_slices(B, threads // 2, x.itemsize, packed)
        mid = np.empty((2, T, B, D * H) if L > 1 and not save else (0, 0, 0, 0), x.dtype)
        parts = np.array([(p * B // n, (p + 1) * B // n, d, d + 1) for d in range(D)
                          for p in range(n)], np.int64)
        for layer in range(L):
            _fwd_split(args, parts, layer, layer + 1, mid)
        return
    n = _batch_slices(B, threads, x.itemsize, packed)
    mid = np.empty((0, 0, 0, 0), x.dtype)
    if n == 1:
        _fwd_part(*args, 0, B, 0, L, 0, D, mid)
        return
    _fwd_split(args, np.array([(p * B // n, (p + 1) * B // n, 0, D) for p in range(n)],
                              np.int64), 0, L, mid)


def _fwd_split(args, parts, l0, l1, mid):
    """:func:`_fwd_part` of the layers ``l0 .. l1`` for each row ``(b0, b1, d0, d1)`` of
    ``parts`` (sequences, directions) at once: by a parallel loop (:func:`_fwd_parts`, ``lib.team``)
    where it is ready, else on ``run_parts``' helpers. A helper after another kernel's
    parallel loop shares the second core with the team's thread while it polls for its next
    loop: a GRU classifier at batch 16 on two threads (two slices of 8, after the transpose
    of its input on the team) ran 0.7 or 1.4 ms by turns, 0.95 on one thread; by the loop 0.7."""
    if team.run(_fwd_parts, (*args, parts, l0, l1, mid, len(parts))):
        return
    run_parts(_fwd_part, [(*args, int(b0), int(b1), l0, l1, int(d0), int(d1), mid)
                          for b0, b1, d0, d1 in parts], len(parts) - 1)


@pjit
def _fwd_parts(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
               out, hn, cn, reserve, bounds, l0, l1, mid, parts):
    """:func:`_fwd_split`'s split, part ``p`` (sequences ``bounds[p, 0] .. bounds[p, 1]``,
    directions ``bounds[p, 2] .. bounds[p, 3]``) on a thread of a parallel loop."""
    for p in numba.prange(parts):
        _fwd_part(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
                  out, hn, cn, reserve, bounds[p, 0], bounds[p, 1], l0, l1, bounds[p, 2],
                  bounds[p, 3], mid)


def rnn_backward(x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask, drop_scale,
                 dout, dhn, dcn, dx, dh0, dc0, dw, parts=None):
    """Gradients of :func:`rnn_forward` (run with ``save``) from ``reserve``: ``dx`` (not
    computed when empty: nothing reads it), ``dh0``, ``dc0`` (LSTM; not written otherwise) and
    ``dw`` (flat, in ``w``'s order) from the gradients of ``out``, ``hn`` and ``cn``. A large
    batch is split into slices run on threads, each with weight gradients of its own, summed
    at the end."""
    T, B = x.shape[0], x.shape[1]
    G = 4 if mode == LSTM else 3 if mode == GRU else 1
    n = max(1, min(_threads(T * B * G * hidden * (x.shape[2] + hidden) * num_layers * ndir,
                            parts), B))
    head = (x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask, drop_scale, dout,
            dhn, dcn, dx, dh0, dc0)
    if n == 1:
        _bwd_part(*head, dw, 0, B)
        return
    dws = [np.empty_like(dw) for _ in range(1, n)]
    run_parts(_bwd_part, [(*head, dws[p - 1] if p else dw, p * B // n, (p + 1) * B // n)
                          for p in range(n)], n - 1)
    for part in dws:
        dw += part


# Called from native code (a whole plan step compiled as one function, e.g. an ahead-of-time
# artifact, which has no thread pool): the batch runs as one slice on the calling thread.
@overload(rnn_forward, jit_options={"nogil": True})
def _rnn_forward_native(x, h0, c0, w, lens, mode, num_layers, ndir, save, drop_mask,
                        drop_scale, out, hn, cn, reserve, parts=None):
    def serial(x, h0, c0, w, lens, mode, num_layers, ndir, save, drop_mask, drop_scale, out,
               hn, cn, reserve, parts=None):
        wc = np.ascontiguousarray(w)
        table = _flat_table(wc, mode, x.shape[2], h0.shape[2], num_layers, ndir)
        _fwd_part(x, h0, c0, table, lens, mode, num_layers, ndir, save, drop_mask,
                  drop_scale, out, hn, cn, reserve, 0, x.shape[1], 0, num_layers, 0, ndir,
                  np.empty((0, 0, 0, 0), x.dtype))
    return serial


@overload(rnn_forward_at, jit_options={"nogil": True})
def _rnn_forward_at_native(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask,
                           drop_scale, out, hn, cn, reserve, parts=None):
    def serial(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale, out,
               hn, cn, reserve, parts=None):
        _fwd_part(x, h0, c0, wt, lens, mode, num_layers, ndir, save, drop_mask, drop_scale,
                  out, hn, cn, reserve, 0, x.shape[1], 0, num_layers, 0, ndir,
                  np.empty((0, 0, 0, 0), x.dtype))
    return serial


@overload(rnn_backward, jit_options={"nogil": True})
def _rnn_backward_native(x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask,
                         drop_scale, dout, dhn, dcn, dx, dh0, dc0, dw, parts=None):
    def serial(x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask, drop_scale,
               dout, dhn, dcn, dx, dh0, dc0, dw, parts=None):
        _bwd_part(x, w, lens, mode, num_layers, ndir, hidden, reserve, drop_mask, drop_scale,
                  dout, dhn, dcn, dx, dh0, dc0, dw, 0, x.shape[1])
    return serial


def _arr(T, nd):
    return (T, nd)


def _fwd_job(a, w):
    return (_fwd_part, (_arr(a, 3), _arr(a, 3), _arr(a, 3), w, _arr(np.dtype(np.int64), 1), int,
                        int, int, bool, _arr(np.dtype(np.uint8), 1), float, _arr(a, 3),
                        _arr(a, 3), _arr(a, 3), _arr(a, 1), int, int, int, int, int, int,
                        _arr(a, 4)))


@jobs("rnn_forward")
def _fwd_jobs(T):
    a = np.dtype(T)
    return [(_flat_table, (_arr(a, 1), int, int, int, int, int)),
            _fwd_job(a, _arr(np.dtype(np.int64), 2))]


@jobs("rnn_forward_at")
def _fwd_at_jobs(T):
    return [_fwd_job(np.dtype(T), _arr(np.dtype(np.int64), 2))]


# (compiled ahead by ``pdjit warmup`` and the background warmup only: see ``team.ready``)
@jobs("rnn._fwd_parts (warmup)")
def _fwd_parts_jobs(T):
    a, i64 = np.dtype(T), np.dtype(np.int64)
    return [(_fwd_parts, (_arr(a, 3), _arr(a, 3), _arr(a, 3), _arr(i64, 2), _arr(i64, 1), int,
                          int, int, bool, _arr(np.dtype(np.uint8), 1), float, _arr(a, 3),
                          _arr(a, 3), _arr(a, 3), _arr(a, 1), _arr(i64, 2), int, int,
                          _arr(a, 4), int))]


jobs("rnn_weight_table")(lambda T: [_pg._pack_job(T)])


@jobs("rnn_backward")
def _bwd_jobs(T):
    a = np.dtype(T)
    return [(_bwd_part, (_arr(a, 3), _arr(a, 1), _arr(np.dtype(np.int64), 1), int, int,
                         int, int, _arr(a, 1), _arr(np.dtype(np.uint8), 1), float,
                         _arr(a, 3), _arr(a, 3), _arr(a, 3), _arr(a, 3), _arr(a, 3),
                         _arr(a, 3), _arr(a, 1), int, int))]

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(8.4, _fwd_part)
compile_cost(9.0, _fwd_parts)
compile_cost(7.7, _bwd_part)
compile_cost(0.6, _flat_table)
