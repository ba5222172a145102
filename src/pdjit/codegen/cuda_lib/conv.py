"""Convolution on the device as an implicit GEMM (``_cu.conv2d_fwd``, ``_cu.conv2d_bwd_data``,
``_cu.conv2d_bwd_filter``): the tiled shared-memory GEMM of :mod:`pdjit.codegen.cuda_lib` whose
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
computes a TILE x TILE tile of the product, one output per thread in a register accumulator,
the reduction in steps of TILE staged through two shared tiles; only the rules that gather an
element of the left operand (``A``) and of the right one (``B``) and the rule that stores a
result differ, chosen by the kernel's ``mode`` (a constant of each compiled kernel, so each
holds only its own rules). The blocks run over the tiles of every group's product
(grid-stride: at most ``MAX_BLOCKS`` blocks, one under the simulator). Images are
indexed through their strides, so NCHW and NHWC share the kernels; every size, stride, pad and
dilation is a run-time argument (one compiled kernel per dtype and mode for every layer).

The kernels are closures over their dtype (a shared array's dtype is a compile-time constant),
compiled once per process at their first launch, as the GEMM's are.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from pdjit.codegen import cuda_lib as _lib

#: the tile (TILE x TILE threads per block): the GEMM's (8 under the simulator, where one block
#: of Python threads runs over every tile, the tests several tiles per product)
TILE = _lib.TILE
FWD, FILTER, DATA = 0, 1, 2
_MODES = {FWD: "conv2d_fwd", FILTER: "conv2d_bwd_filter", DATA: "conv2d_bwd_data"}
_KERNELS: dict = {}


def _igemm_kernel(dtype, mode: int):
    """The implicit-GEMM kernel of one float ``dtype`` and ``mode`` (FWD, FILTER, DATA)."""
    key = (np.dtype(dtype), int(mode))
    k = _KERNELS.get(key)
    if k is not None:
        return k
    nbtype = {np.dtype(np.float32): np.float32, np.dtype(np.float64): np.float64}[key[0]]
    tile = TILE
    fwd, filt = mode == FWD, mode == FILTER

    def igemm(A, B, C, N, H, W, CG, KH, KW, OH, OW, MG, groups, sh, sw, pt, pl, dh, dw,
              xn, xc, xh, xw, yn, yc, yh, yw):
        # A, B, C: flat arrays (see the module's doc for which is which in each mode); the
        # image X (dX) is indexed through strides xn, xc, xh, xw, the output Y (dY) through
        # yn, yc, yh, yw; the filter is C-contiguous [M, CG, KH, KW]
        sa = cuda.shared.array((tile, tile), nbtype)
        sb = cuda.shared.array((tile, tile), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        khw = KH * KW
        ohw = OH * OW
        if fwd:
            nrow = MG
            ncol = N * ohw
            kk = CG * khw
        elif filt:
            nrow = MG
            ncol = CG * khw
            kk = N * ohw
        else:
            nrow = CG
            ncol = N * H * W
            kk = MG * khw
        # the tiles of every group's product, grid-stride over the blocks: tile = (group,
        # tile row, tile column), columns fastest
        tcols = (ncol + tile - 1) // tile
        per_group = (nrow + tile - 1) // tile * tcols
        t = cuda.blockIdx.x
        while t < groups * per_group:
            g = t // per_group
            u = t - g * per_group
            row = (u // tcols) * tile + ty
            col = (u - (u // tcols) * tcols) * tile + tx
            acc = nbtype(0)
            for t0 in range(0, kk, tile):
                # A[row, t0 + tx] into sa[ty, tx]
                k = t0 + tx
                v = nbtype(0)
                if row < nrow and k < kk:
                    if fwd:     # the filter row of output channel g*MG + row
                        v = A[(g * MG + row) * kk + k]
                    elif filt:  # dY[n, g*MG + row, oh, ow], k = (n, oh, ow)
                        n = k // ohw
                        o = k - n * ohw
                        oh = o // OW
                        v = A[n * yn + (g * MG + row) * yc + oh * yh + (o - oh * OW) * yw]
                    else:       # Wt[g*MG + m, row, a, b], k = (m, a, b): Wt_g transposed
                        m = k // khw
                        ab = k - m * khw
                        v = A[((g * MG + m) * CG + row) * khw + ab]
                sa[ty, tx] = v
                # B[t0 + ty, col] into sb[ty, tx]
                k = t0 + ty
                v = nbtype(0)
                if col < ncol and k < kk:
                    if fwd or filt:
                        # the patch matrix: channel-and-tap (c, a, b) against position
                        # (n, oh, ow); cols[k, col] forward, cols^T[k, col] for the filter
                        if fwd:
                            cab = k
                            p = col
                        else:
                            cab = col
                            p = k
                        c = cab // khw
                        ab = cab - c * khw
                        a = ab // KW
                        n = p // ohw
                        o = p - n * ohw
                        oh = o // OW
                        ih = oh * sh - pt + a * dh
                        iw = (o - oh * OW) * sw - pl + (ab - a * KW) * dw
                        if ih >= 0 and ih < H and iw >= 0 and iw < W:
                            v = B[n * xn + (g * CG + c) * xc + ih * xh + iw * xw]
                    else:
                        # the output gradient where the window of (m, a, b) lands exactly
                        # on image position (n, ih, iw) = col
                        m = k // khw
                        ab = k - m * khw
                        a = ab // KW
                        hw = H * W
                        n = col // hw
                        o = col - n * hw
                        ih = o // W
                        th = ih + pt - a * dh
                        tw = (o - ih * W) + pl - (ab - a * KW) * dw
                        if th >= 0 and tw >= 0 and th % sh == 0 and tw % sw == 0:
                            oh = th // sh
                            ow = tw // sw
                            if oh < OH and ow < OW:
                                v = B[n * yn + (g * MG + m) * yc + oh * yh + ow * yw]
                sb[ty, tx] = v
                cuda.syncthreads()
                for q in range(tile):
                    acc += sa[ty, q] * sb[q, tx]
                cuda.syncthreads()
            if row < nrow and col < ncol:
                if fwd:
                    n = col // ohw
                    o = col - n * ohw
                    oh = o // OW
                    C[n * yn + (g * MG + row) * yc + oh * yh + (o - oh * OW) * yw] = acc
                elif filt:
                    C[(g * MG + row) * ncol + col] = acc
                else:
                    hw = H * W
                    n = col // hw
                    o = col - n * hw
                    ih = o // W
                    C[n * xn + (g * CG + row) * xc + ih * xh + (o - ih * W) * xw] = acc
            t += cuda.gridDim.x

    k = _KERNELS[key] = cuda.jit(igemm)
    return k


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
    tiles = groups * -(-rows // T) * -(-cols // T)
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
