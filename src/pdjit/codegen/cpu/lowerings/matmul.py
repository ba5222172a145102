"""The matrix products of :mod:`pdjit.ops.matmul` on the CPU: the ops' own GEMM lines (their
generic rule), and, for ``mul``, ``matmul`` and ``matmul_v2`` followed by an elementwise chain,
the product by blocks of samples (``Opaque.blocked``: ``_nn.gemm_rows``, the chain run on each
block while it is in cache; see ``_gemm_blocked`` for the size rule and its measurements).

A product by a weight (``_weight``: a parameter no op of the program writes) runs on pdjit's
packed GEMM with the weight packed once (``_nn.weight_gemm``; ``pdjit.codegen.cpu.lib.pgemm``),
and takes the bias add, residual add and clamp after it into the stores of its tiles
(``_weight_blocked``: ``_nn.weight_rows``). Measured on a BERT-like encoder (6 post-norm layers
of d 256, 4 heads, ffn 1024, seq 128; ``benchmarks/bench_models.py --models bert --threads 1``,
load 2.5-4.4), pdjit / ONNX Runtime is 1.34x at batch 1 and 1.03x at batch 16 with it, 1.81x
and 1.32x with the products by BLAS."""
from __future__ import annotations

import math

import numpy as np

from pdjit.codegen.cpu.lib import gemm as _gemm
from pdjit.codegen.cpu.lib.pgemm import PACKED_MIN_ROWS
from pdjit.codegen.cpu.lowerings import lowering
from pdjit.codegen.lowering import weight_var
from pdjit.ops.matmul import (
    _as_matrix,
    _blas_ok,
    _matmul_2d_lower,
    _mul_lower,
    _prod,
)

#: a product of at least this many multiply-adds (``threads.GEMM_PARALLEL_MIN_WORK``: those a
#: host driver may put on several threads) is computed by blocks of samples when an elementwise
#: chain (bias, activation) follows it; smaller ones stay one GEMM (see ``_gemm_blocked``)
BLOCKED_MIN_WORK = 1 << 25
#: the batch (X's first dim) the size rule assumes where it is known only at run time
UNKNOWN_BATCH = 8
#: the output elements of one block (the cpu target's ``BLOCK_ELEMS``: whole samples of about
#: that many) and the fewest rows a block may have: each block's BLAS call packs all of Y
#: again (one thread, [2048, 256] x [256, 1024] float32 by blocks of 128 / 256 / 512 rows /
#: whole: 8.2 / 6.5 / 6.2 / 5.7 ms; a BERT-like encoder at batch 16, its products whole and
#: their chains a pass after: 227-245 -> 202-208 ms)
BLOCK_OUTPUT_ELEMS = 1 << 16
BLOCKED_MIN_ROWS = 512


def _gemm_blocked(ctx, xn: int, ta: bool = False, tb: bool = False, scaled: bool = False):
    """``Opaque.blocked`` of a product ``flatten(X, xn) @ Y`` (Y a matrix, float operands of
    one dtype, no transpose, no scale): the output allocated whole, ``_nn.gemm_rows`` computing
    the rows of samples ``n0 .. n1`` (a sample: the ``X.shape[1:xn]`` rows under one index of
    the output's first dim), so the bias and activation after it run on each block while it is
    in cache, blocks split over the loop threads (one BLAS thread each) when
    ``threads.gemm_threads`` gives the product more than one. Declined (None) below
    ``BLOCKED_MIN_WORK`` multiply-adds (an unknown batch counted as ``UNKNOWN_BATCH``), for
    other unknown sizes, transposes or a scale, for blocks of fewer than ``BLOCKED_MIN_ROWS``
    rows (a matrix X times a wide Y), and when a
    thread count above one was asked for (``PDJIT_NUM_THREADS=2``, forced by blocks on the
    busy machine: 8.0 -> 56-64 ms for [8,128,256] x [256,256] + bias, the blocks' BLAS calls on
    two threads each).

    Measured on the 2-vCPU machine (busy: load 2-4 from other processes; float32, medians of
    40 executor runs, ms, today's GEMM-then-chain vs by blocks): with the product on one
    thread (``free_cores`` 1) blocks lose by the smaller GEMMs (a block is ~64K output
    elements: 64 to 256 rows), [8,128,256] x [256,1024] + bias + gelu 12.1 -> 13.0,
    [8,128,256] x [256,256] + bias 1.54 -> 1.53, [1024,256] x [256,1024] + bias + relu
    10.0 -> 11.5 (np.dot of 64-row blocks alone: 5.4 -> 6.7); with two free cores (forced)
    the split over two loop threads, one BLAS thread each, wins over NumPy's two BLAS threads
    and a parallel chain: 16.0 -> 8.2, 8.0 -> 1.46, 12.0 -> 7.8. The MLP's products (at most
    128x256x256, 8.4M, equal either way: 0.19 / 0.20) stay below the threshold. The whole
    encoder layer of ``benchmarks/bench_sequence_models.py`` (batch unknown at build time, its
    six fc products by blocks), load 4-5: 35.4-38.9 ms by blocks vs 35.6-36.9 today with
    ``free_cores`` 1; with two free cores (forced) 38.7-39.6 vs 82-84 (NumPy's two BLAS
    threads on the busy cores). At a quieter moment (load ~2, both modes on two threads) the
    chains were even: 4.09-4.12 vs 4.11-4.15 ms (gelu), 0.785-0.789 vs 0.794-0.826 (bias),
    and the layer 14.3-15.8 ms by blocks vs 15.0-23.5 today: the chain's separate pass is
    cheap next to the GEMM; blocks mostly spare the threaded-BLAS stalls."""
    if not _blas_ok(ctx) or ta or tb or scaled or ctx.rank("Y") != 2:
        return None
    if ctx.gen.parallel:  # a thread count > 1 asked for: BLAS's too, and
        return None                          # concurrent threaded BLAS calls fight
    rx = ctx.rank("X")
    xs, ys = ctx.shape("X"), ctx.shape("Y")
    if xn < 1 or xn >= rx or any(d is None or d < 0 for d in tuple(xs[1:]) + tuple(ys)):
        return None
    if _prod((xs[0] if xs[0] >= 0 else UNKNOWN_BATCH,) + tuple(xs[1:])) * ys[1] < \
            BLOCKED_MIN_WORK:
        return None
    r = _prod(xs[1:xn])
    if r * max(1, BLOCK_OUTPUT_ELEMS // max(1, r * ys[1])) < BLOCKED_MIN_ROWS:
        return None
    X, Y = ctx.inp("X"), ctx.inp("Y")
    dims = [f"{X}.shape[{i}]" for i in range(xn)] + [f"{Y}.shape[1]"]
    out = ctx.out("Out", shape=ctx.tuple_src(dims))
    lx, x2 = _as_matrix(ctx, X, rx, xn)
    o2 = ctx.tmp("o")
    lines = lx + [f"{o2} = {out}.reshape(({x2}.shape[0], {Y}.shape[1]))"]
    return (lines, ctx.lib_fn("gemm_rows"), [x2, Y], [o2, ctx.prod(X, 1, xn)],
            f"{ctx.lib_fn('gemm_split_work')}({x2}, {Y})")


def _weight_blocked(ctx, xn: int, trans: bool):
    """``Opaque.blocked`` of ``flatten(X, xn) @ Y`` by a weight Y (``_weight``; ``Y.T`` where
    ``trans``): ``_nn.weight_rows`` on Y packed once, taking the bias add along the output's
    last axis, a residual add and a clamp after it (``LowerContext.channel_epilogue``) into
    the stores of its tiles; by blocks of samples of any size (no block packs Y again)."""
    rx = ctx.rank("X")
    if xn < 1 or xn >= rx:
        return None
    X, Y = ctx.inp("X"), ctx.inp("Y")
    lines: list = []
    bias, lo, hi, res = ctx.channel_epilogue(ctx.T("X"), lines, residual=True)
    n = f"{Y}.shape[{0 if trans else 1}]"
    dims = [f"{X}.shape[{i}]" for i in range(xn)] + [n]
    out = ctx.out("Out", shape=ctx.tuple_src(dims))
    lx, x2 = _as_matrix(ctx, X, rx, xn)
    o2, bp = ctx.tmp("o"), ctx.tmp("bp")
    dv = ctx.derived("packed_weight", [("Y", 0)], (trans, PACKED_MIN_ROWS))
    lines += lx + [f"{o2} = {out}.reshape(({x2}.shape[0], {n}))",
                   f"{bp} = {ctx.lib_fn('packed_weight')}({Y}, {trans}, {x2}.shape[0])"
                   if dv is None else
                   f"{bp} = {dv} if {x2}.shape[0] >= {PACKED_MIN_ROWS} else {dv}[:0]"]
    return (lines, ctx.lib_fn("weight_rows"), [x2, Y, str(trans), bp],
            [o2, ctx.prod(X, 1, xn), bias, res, lo, hi],
            f"{ctx.lib_fn('weight_split_work')}({x2}, {Y})")


def _mul_blocked(ctx):
    if ctx.attrs["y_num_col_dims"] != 1:
        return None
    if _weight(ctx, ctx.attrs["x_num_col_dims"]):
        return _weight_blocked(ctx, ctx.attrs["x_num_col_dims"], False)
    return _gemm_blocked(ctx, ctx.attrs["x_num_col_dims"])



def _matmul_blocked(tx_attr, ty_attr, alpha_attr=None):
    """Rank-2 (or rows-folded, see ``_rows_of_x``) matmul by blocks: by a weight
    (``_weight_blocked``), else ``_gemm_blocked``."""
    def blocked(ctx):
        if ctx.rank("Y") != 2 or ctx.rank("X") < 2:
            return None
        if not ctx.attrs[tx_attr] and (not alpha_attr or ctx.attrs[alpha_attr] == 1.0) and \
                _weight(ctx, ctx.rank("X") - 1):
            return _weight_blocked(ctx, ctx.rank("X") - 1, bool(ctx.attrs[ty_attr]))
        return _gemm_blocked(ctx, ctx.rank("X") - 1, bool(ctx.attrs[tx_attr]),
                             bool(ctx.attrs[ty_attr]),
                             bool(alpha_attr) and ctx.attrs[alpha_attr] != 1.0)
    return blocked


_PACKED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _weight(ctx, xn: int) -> bool:
    """Whether the product of ``flatten(X, xn)`` by Y runs on Y packed once (``_nn.weight_gemm``,
    the packed copy made again after a run that may write Y, see ``pdjit.codegen.params``): Y is
    a weight (a float32/float64 matrix of X's dtype, persistable, that no op of the program
    writes: an inference program's parameter), and each sample gives the product rows of its
    own (X's dims 1..xn-1: a sequence's positions, known or not at build time, of
    ``PACKED_MIN_ROWS`` or more). A product whose rows are the batch alone stays with BLAS: its
    rows are few at the batch sizes of serving, and the packed kernel costs ~1.5 s of CPU to
    compile."""
    if xn < 2:
        return False
    per_sample = ctx.shape("X")[1:xn]
    if all(d >= 0 for d in per_sample) and math.prod(per_sample) < PACKED_MIN_ROWS:
        return False
    return _weight_operand(ctx)


def _weight_operand(ctx) -> bool:
    """Whether Y is a weight a product may keep a copy or a split of: a float32/float64 matrix
    of X's dtype, persistable, that no op of the program writes."""
    return _blas_ok(ctx) and ctx.rank("Y") == 2 and ctx.dtype("X") in _PACKED_DTYPES and \
        ctx.dtype("Y") == ctx.dtype("X") and weight_var(ctx.op, ctx.op.input("Y")[0]) is not None


def _vector_weight(ctx, xn: int) -> bool:
    """Whether the product of ``flatten(X, xn)`` by Y has a row per sample (X's dims
    ``1 .. xn-1`` all one: a classifier's last layer) and Y is a weight (a float matrix of X's
    dtype that no op of the program writes) of ``VECTOR_MIN_VALUES`` or more:
    ``_nn.weight_vector``, which splits a few samples' product over the loop threads (smaller
    products stay the op's own GEMM line)."""
    return 1 <= xn < ctx.rank("X") and all(d == 1 for d in ctx.shape("X")[1:xn]) and \
        _prod(ctx.shape("Y")) >= _gemm.VECTOR_MIN_VALUES and _weight_operand(ctx)


def _vector_lines(ctx, xn: int, trans: bool):
    """``Out = flatten(X, xn) @ Y`` (``Y.T`` where ``trans``) by ``_nn.weight_vector`` into the
    output the driver allocates."""
    X, Y = ctx.inp("X"), ctx.inp("Y")
    lines, x2 = _as_matrix(ctx, X, ctx.rank("X"), xn)
    n = f"{Y}.shape[{0 if trans else 1}]"
    out = ctx.out("Out", shape=ctx.tuple_src([f"{X}.shape[{i}]" for i in range(xn)] + [n]))
    o2 = ctx.tmp("o")
    return lines + [f"{o2} = {out}.reshape(({x2}.shape[0], {n}))",
                    f"{ctx.lib_fn('weight_vector')}({x2}, {Y}, {trans}, {o2})"]


def _weight_lines(ctx, xn: int, trans: bool):
    """``Out = flatten(X, xn) @ Y`` (``Y.T`` where ``trans``) on Y packed once, back to X's
    first ``xn`` dims and Y's columns."""
    X, Y = ctx.inp("X"), ctx.inp("Y")
    rx = ctx.rank("X")
    lines, x2 = _as_matrix(ctx, X, rx, xn)
    dims = [f"{X}.shape[{i}]" for i in range(xn)] + [f"{Y}.shape[{0 if trans else 1}]"]
    out = f"{ctx.lib_fn('weight_gemm')}({x2}, {Y}, {trans})"
    if len(dims) != 2:
        out += f".reshape({ctx.tuple_src(dims)})"
    return lines + [f"{ctx.out('Out')} = {out}"]


def _mul_weight_lower(ctx):
    """``mul`` by a weight on it packed once (``_weight``); any other as the op's GEMM."""
    xn = ctx.attrs["x_num_col_dims"]
    if ctx.attrs["y_num_col_dims"] == 1 and _weight(ctx, xn):
        return _weight_lines(ctx, xn, False)
    if ctx.attrs["y_num_col_dims"] == 1 and _vector_weight(ctx, xn):
        return _vector_lines(ctx, xn, False)
    return _mul_lower(ctx)


def _matmul_weight_lower(tx_attr, ty_attr, alpha_attr=None):
    """A matmul whose X's rows fold (``[..., K] x [K, N]``, X not transposed, no scale) by a
    weight on it packed once (``_weight``); any other as the op's own lines."""
    generic = _matmul_2d_lower(tx_attr, ty_attr, alpha_attr)

    def lower(ctx):
        if ctx.rank("X") >= 2 and not ctx.attrs[tx_attr] and \
                (not alpha_attr or ctx.attrs[alpha_attr] == 1.0):
            xn, trans = ctx.rank("X") - 1, bool(ctx.attrs[ty_attr])
            if _weight(ctx, xn):
                return _weight_lines(ctx, xn, trans)
            if not trans and _vector_weight(ctx, xn):  # (a transposed one: BLAS's)
                return _vector_lines(ctx, xn, trans)
        return generic(ctx)
    return lower


lowering("mul", host=True, blas=True, blocked=_mul_blocked, channel_axis=-1)(_mul_weight_lower)
lowering("matmul", host=True, blas=True,
         blocked=_matmul_blocked("transpose_X", "transpose_Y", "alpha"), channel_axis=-1)(
    _matmul_weight_lower("transpose_X", "transpose_Y", "alpha"))
lowering("matmul_v2", host=True, blas=True,
         blocked=_matmul_blocked("trans_x", "trans_y"), channel_axis=-1)(
    _matmul_weight_lower("trans_x", "trans_y"))
