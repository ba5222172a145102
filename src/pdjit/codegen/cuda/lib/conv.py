"""Convolution on the device as an implicit GEMM (``_cu.conv2d_fwd``, ``_cu.conv2d_bwd_data``,
``_cu.conv2d_bwd_filter``): the tiled shared-memory GEMM of :mod:`pdjit.codegen.cuda.lib` whose
operand tiles are gathered from the image, the filter and the output gradient as they are
loaded into shared memory (no im2col buffer in device memory).

Per group ``g`` of a convolution with image ``X [N, C, H, W]``, filter ``Wt [M, C/groups, KH,
KW]`` and output ``Y [N, M, OH, OW]`` (``MG = M / groups``, ``CG = C / groups``), with the patch
matrix ``cols[(c, a, b), (n, oh, ow)] = X[n, g*CG + c, oh*sh - pt + a*dh, ow*sw - pl + b*dw]``
(0 in the padding):

- forward (``FWD``): ``Y_g [MG, N*OH*OW] = Wt_g [MG, CG*KH*KW] x cols``;
- filter gradient (``FILTER``): ``dWt_g [MG, CG*KH*KW] = dY_g [MG, N*OH*OW] x cols^T`` (the
  reduction runs over ``N*OH*OW``);
- input gradient (``DATA``): ``dX_g [CG, N*H*W] = Wt_g^T [CG, MG*KH*KW] x rows``, with
  ``rows[(m, a, b), (n, ih, iw)] = dY[n, g*MG + m, th / sh, tw / sw]`` where ``th = ih + pt -
  a*dh`` (``tw`` alike) is a multiple of the stride inside the output, 0 elsewhere: the
  positions whose window meets ``(ih, iw)``; a tiled product, no col2im scatter.

One kernel skeleton (:func:`_igemm_kernel`) serves the three: a block of TILE x TILE threads
computes a (TILE*RB) x (TILE*RB) tile of the product, RB x RB outputs per thread in register
accumulators (a thread's rows and columns TILE apart), the reduction in steps of TILE staged
through two shared tiles (TILE*RB x TILE of the left operand, TILE x TILE*RB of the right);
each step every thread multiplies RB values of one by RB of the other (RB*RB products for
2*RB shared-memory reads; the compiled PTX keeps the accumulators in registers through the
reduction, spilling them to local memory once for the final stores). Only the rules that
gather an element of the left operand (``A``) and of the right one (``B``) and the rule that
stores a result differ, chosen by the kernel's ``mode`` (a constant of each compiled kernel,
so each holds only its own rules). The blocks run over the tiles of every group's product
(grid-stride: at most ``MAX_BLOCKS`` blocks, one under the simulator). Images are indexed
through their strides, so NCHW and NHWC share the kernels; every size, stride, pad and
dilation is a run-time argument (one compiled kernel per dtype and mode for every layer).
No GPU has timed these kernels: the tile sizes are the usual ones for such a product, not
tuned.

The kernels are closures over their dtype (a shared array's dtype is a compile-time constant),
compiled once per process at their first launch, as the GEMM's are.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from pdjit.codegen.cuda.lib import launch as _lib

#: the threads per block are TILE x TILE (4 x 4 under the simulator, where one block of Python
#: threads runs over every tile: the tests cover several tiles per product)
TILE = 4 if _lib.SIMULATOR else _lib.TILE
#: the outputs per thread along each side (RB x RB register accumulators): a block computes a
#: (TILE*RB) x (TILE*RB) tile of the product
RB = 2 if _lib.SIMULATOR else 4
FWD, FILTER, DATA = 0, 1, 2
#: an offset that keeps an index negative (outside the image): a column or row past the end
_FAR = -(1 << 40)
_MODES = {FWD: "conv2d_fwd", FILTER: "conv2d_bwd_filter", DATA: "conv2d_bwd_data"}


@_lib.per_dtype
def _igemm_kernel(nbtype, mode: int):
    """The implicit-GEMM kernel of one float dtype (``_igemm_kernel(dtype, mode)``) and
    ``mode`` (FWD, FILTER, DATA)."""
    tile, rb = TILE, RB
    bt = tile * rb   # the block's tile of the product: bt x bt, the reduction in steps of tile
    fwd, filt = mode == FWD, mode == FILTER

    far = _FAR

    def igemm(A, B, C, N, H, W, CG, KH, KW, OH, OW, MG, groups, sh, sw, pt, pl, dh, dw,
              xn, xc, xh, xw, yn, yc, yh, yw):
        # A, B, C: flat arrays (see the module's doc for which is which in each mode); the
        # image X (dX) is indexed through strides xn, xc, xh, xw, the output Y (dY) through
        # yn, yc, yh, yw; the filter is C-contiguous [M, CG, KH, KW]. Thread (ty, tx) owns
        # rows ty + i*tile and columns tx + j*tile of the block's tile (i, j < rb). An
        # element of B is the sum of a part of its column (worked out once per tile: jb, jh,
        # jw; js: where the column's results go) and a part of its row k (once per step)
        sa = cuda.shared.array((bt, tile), nbtype)
        sb = cuda.shared.array((tile, bt), nbtype)
        acc = cuda.local.array((rb, rb), nbtype)
        ra = cuda.local.array(rb, nbtype)
        jb = cuda.local.array(rb, np.int64)
        jh = cuda.local.array(rb, np.int64)
        jw = cuda.local.array(rb, np.int64)
        js = cuda.local.array(rb, np.int64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        khw = KH * KW
        ohw = OH * OW
        hw = H * W
        if fwd:
            nrow = MG
            ncol = N * ohw
            kk = CG * khw
            rstride = kk    # A = the filter rows of the group
        elif filt:
            nrow = MG
            ncol = CG * khw
            kk = N * ohw
            rstride = yc    # A = dY's channels of the group
        else:
            nrow = CG
            ncol = N * hw
            kk = MG * khw
            rstride = khw   # A = the group's filter, transposed
        # the tiles of every group's product, grid-stride over the blocks: tile = (group,
        # tile row, tile column), columns fastest
        tcols = (ncol + bt - 1) // bt
        per_group = (nrow + bt - 1) // bt * tcols
        t = cuda.blockIdx.x
        while t < groups * per_group:
            g = t // per_group
            u = t - g * per_group
            row0 = (u // tcols) * bt + ty
            col0 = (u - (u // tcols) * tcols) * bt + tx
            for j in range(rb):
                col = col0 + j * tile
                jb[j] = 0
                jh[j] = far     # a column past the end reads nothing
                jw[j] = 0
                js[j] = 0
                if col < ncol:
                    if fwd:     # output position (n, oh, ow): the window's corner
                        n = col // ohw
                        o = col - n * ohw
                        oh = o // OW
                        ow = o - oh * OW
                        jb[j] = n * xn + g * CG * xc
                        jh[j] = oh * sh - pt
                        jw[j] = ow * sw - pl
                        js[j] = n * yn + oh * yh + ow * yw
                    elif filt:  # filter tap (c, a, b): the offset in the window
                        c = col // khw
                        ab = col - c * khw
                        a = ab // KW
                        jb[j] = c * xc
                        jh[j] = a * dh
                        jw[j] = (ab - a * KW) * dw
                        js[j] = col
                    else:       # image position (n, ih, iw)
                        n = col // hw
                        o = col - n * hw
                        ih = o // W
                        iw = o - ih * W
                        jb[j] = n * yn
                        jh[j] = ih
                        jw[j] = iw
                        js[j] = n * xn + ih * xh + iw * xw
            for i in range(rb):
                for j in range(rb):
                    acc[i, j] = nbtype(0)
            for t0 in range(0, kk, tile):
                # A[row, k = t0 + tx] into sa[row - the tile's first row, tx]
                k = t0 + tx
                kin = k < kk
                kbase = 0
                if kin:
                    if fwd:     # Wt[g*MG + row, k]
                        kbase = g * MG * kk + k
                    elif filt:  # dY[n, g*MG + row, oh, ow], k = (n, oh, ow)
                        n = k // ohw
                        o = k - n * ohw
                        oh = o // OW
                        kbase = n * yn + g * MG * yc + oh * yh + (o - oh * OW) * yw
                    else:       # Wt[g*MG + m, row, a, b], k = (m, (a, b))
                        m = k // khw
                        kbase = (g * MG + m) * CG * khw + (k - m * khw)
                for i in range(rb):
                    row = row0 + i * tile
                    v = nbtype(0)
                    if kin and row < nrow:
                        v = A[kbase + row * rstride]
                    sa[ty + i * tile, tx] = v
                # B[k = t0 + ty, col] into sb[ty, col - the tile's first column]
                k = t0 + ty
                kb = 0
                kh_ = far
                kw_ = 0
                if k < kk:
                    if fwd:     # filter tap (c, a, b)
                        c = k // khw
                        ab = k - c * khw
                        a = ab // KW
                        kb = c * xc
                        kh_ = a * dh
                        kw_ = (ab - a * KW) * dw
                    elif filt:  # output position (n, oh, ow)
                        n = k // ohw
                        o = k - n * ohw
                        oh = o // OW
                        kb = n * xn + g * CG * xc
                        kh_ = oh * sh - pt
                        kw_ = (o - oh * OW) * sw - pl
                    else:       # output channel and tap (m, a, b)
                        m = k // khw
                        ab = k - m * khw
                        a = ab // KW
                        kb = (g * MG + m) * yc
                        kh_ = pt - a * dh
                        kw_ = pl - (ab - a * KW) * dw
                for j in range(rb):
                    v = nbtype(0)
                    ih = jh[j] + kh_
                    iw = jw[j] + kw_
                    if fwd or filt:
                        # the patch matrix (cols forward, cols^T for the filter): the image
                        # at the window corner plus the tap, 0 in the padding
                        if ih >= 0 and ih < H and iw >= 0 and iw < W:
                            v = B[jb[j] + kb + ih * xh + iw * xw]
                    elif ih >= 0 and iw >= 0 and ih % sh == 0 and iw % sw == 0:
                        # dY where the window of tap (a, b) at output (oh, ow) lands exactly
                        # on image position (ih', iw'): oh*sh = ih' + pt - a*dh
                        oh = ih // sh
                        ow = iw // sw
                        if oh < OH and ow < OW:
                            v = B[jb[j] + kb + oh * yh + ow * yw]
                    sb[ty, tx + j * tile] = v
                cuda.syncthreads()
                for q in range(tile):
                    for i in range(rb):
                        ra[i] = sa[ty + i * tile, q]
                    for j in range(rb):
                        bv = sb[q, tx + j * tile]
                        for i in range(rb):
                            acc[i, j] += ra[i] * bv
                cuda.syncthreads()
            for i in range(rb):
                row = row0 + i * tile
                for j in range(rb):
                    if row < nrow and col0 + j * tile < ncol:
                        if fwd:
                            C[js[j] + (g * MG + row) * yc] = acc[i, j]
                        elif filt:
                            C[(g * MG + row) * ncol + js[j]] = acc[i, j]
                        else:
                            C[js[j] + (g * CG + row) * xc] = acc[i, j]
            t += cuda.gridDim.x

    return cuda.jit(igemm)


def _strides(nhwc: bool, shape) -> tuple:
    """Element strides ``(n, c, h, w)`` of a C-contiguous 4-D image of ``shape`` (its own
    layout)."""
    if nhwc:
        _, h, w, c = shape
        return h * w * c, 1, w * c, c
    _, c, h, w = shape
    return c * h * w, h * w, w, 1


def _nchw(nhwc: bool, shape) -> tuple:
    return (shape[0], shape[3], shape[1], shape[2]) if nhwc else tuple(shape)


def _flat(a, what: str):
    if a.ndim != 4:
        raise ValueError(f"pdjit: {what}: expected a rank-4 array, got shape {tuple(a.shape)}")
    if not a.is_c_contiguous():
        raise ValueError(f"pdjit: {what}: expected a C-contiguous device array")
    return a.reshape(a.size)


def _launch(mode, x, w, y, nhwc, sh, sw, pt, pl, dh, dw, groups) -> None:
    """Checks the operands of image ``x``, filter ``w`` and output ``y`` fit (a kernel cannot
    raise: a misfit raises ``ValueError`` here and the plan runs the op's reference, whose
    error names the op), then launches the mode's kernel: ``FWD`` writes ``y``, ``FILTER``
    writes ``w``, ``DATA`` writes ``x``."""
    what = _MODES[mode]
    arrs = (x, w, y)
    if any(np.dtype(a.dtype) != np.dtype(w.dtype) for a in arrs):
        raise ValueError(f"pdjit: {what}: operands of several dtypes")
    fx, fw, fy = (_flat(a, f"{what} ({n})") for a, n in zip(arrs, ("image", "filter",
                                                                      "output")))
    n, c, h, wd = _nchw(nhwc, x.shape)
    m, cg, kh, kw = (int(d) for d in w.shape)
    ny, my, oh, ow = _nchw(nhwc, y.shape)
    groups = int(groups)
    if groups < 1 or m % groups or c != cg * groups or ny != n or my != m:
        raise ValueError(f"pdjit: {what}: image {tuple(x.shape)}, filter {tuple(w.shape)} and "
                         f"output {tuple(y.shape)} do not fit groups={groups}")
    for s, d in ((sh, dh), (sw, dw)):
        if int(s) < 1 or int(d) < 1:
            raise ValueError(f"pdjit: {what}: strides and dilations must be >= 1")
    mg = m // groups
    rows, cols = {FWD: (mg, n * oh * ow), FILTER: (mg, cg * kh * kw),
                  DATA: (cg, n * h * wd)}[mode]
    if not (rows and cols):
        return
    out = {FWD: fy, FILTER: fw, DATA: fx}[mode]
    A, B = {FWD: (fw, fx), FILTER: (fy, fx), DATA: (fw, fy)}[mode]
    T = TILE
    tiles = groups * -(-rows // (T * RB)) * -(-cols // (T * RB))
    _igemm_kernel(w.dtype, mode)[max(1, min(tiles, _lib.MAX_BLOCKS)), (T, T)](
        A, B, out, n, h, wd, cg, kh, kw, oh, ow, mg, groups, int(sh), int(sw), int(pt),
        int(pl), int(dh), int(dw), *_strides(nhwc, x.shape), *_strides(nhwc, y.shape))


def conv2d_fwd(x, w, y, nhwc, sh, sw, pt, pl, dh, dw, groups) -> None:
    """``y = conv(x, w)`` on the device (4-D C-contiguous device arrays; ``nhwc``: the layout
    of ``x`` and ``y``; ``w`` is ``[M, C/groups, KH, KW]``)."""
    _launch(FWD, x, w, y, nhwc, sh, sw, pt, pl, dh, dw, groups)


def conv2d_bwd_filter(x, dy, dw_, nhwc, sh, sw, pt, pl, dh, dw, groups) -> None:
    """``dw_`` = the filter gradient of ``conv(x, w)`` against output gradient ``dy``."""
    _launch(FILTER, x, dw_, dy, nhwc, sh, sw, pt, pl, dh, dw, groups)


def conv2d_bwd_data(dy, w, dx, nhwc, sh, sw, pt, pl, dh, dw, groups) -> None:
    """``dx`` = the image gradient of ``conv(x, w)`` against output gradient ``dy`` (also a
    transposed convolution of ``dy``)."""
    _launch(DATA, dx, w, dy, nhwc, sh, sw, pt, pl, dh, dw, groups)
