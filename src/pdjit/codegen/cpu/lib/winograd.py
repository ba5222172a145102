"""The 3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2015), NCHW float32.

Each 2x2 block of outputs of one sample and output channel ``m`` is
``A^T [sum_c (G g[m, c] G^T) * (B^T d[c] B)] A``, ``d[c]`` the 4x4 block of input channel
``c`` under it (tiles 2 apart, overlapping by 2; zero outside the image) and ``*``
elementwise: with ``U = G g G^T`` and ``V = B^T d B`` taken apart into their 16 elements
``xi``, the sum is 16 matrix products ``M_xi [M, tiles] = U_xi [M, C] @ V_xi [C, tiles]``, 16
multiply-adds per 4 outputs and input channel where the direct convolution makes 36.

- ``U`` (:func:`transformed`): made once per filter, kept beside the array as pgemm's packed
  weights are (:func:`pdjit.codegen.params.derived`: by the array's identity, made again
  after a run that may write it); a filter that is a slice of another along its output
  channels (the host driver splits a one-sample convolution over threads by output channels:
  ``conv._channel_parts``) takes its rows of the whole's ``U``. ``[16, M, C]``: each ``U_xi``
  the left operand of pgemm's micro-kernel as it stands (rows read by broadcast).
- ``V`` and the products, by blocks of whole tile rows (:func:`block_tiles`: ``V`` and ``M``
  of a block stay in the L2 cache): the input transform writes each ``V_xi`` in pgemm's
  panels of :data:`NR` tiles (the micro-kernel's right operand), the 16 products run by
  pgemm's register-blocked micro-kernel (:func:`pdjit.codegen.cpu.lib.pgemm._micro_kernel`),
  and the output transform applies the convolution's epilogue
  ``minimum(maximum(y + bias[m] + res, lo), hi)`` as it stores the outputs of the image
  (those past the plane, of a last tile that sticks out, are not stored).

The results differ from the direct sum's by rounding only, but by more than its: the
transforms add and subtract up to 9 inputs (and filter taps scaled by 1/2, 1/4) before the
products, so the error grows with the data's range (measured on unit-normal data against a
float64 sum, C = 3-512: relative errors of 1e-6 - 1e-5, against 1e-7 - 1e-6 for the taps
kernel).
"""
import numpy as np

from pdjit.codegen import params
from pdjit.codegen.cpu.lib._jit import compile_cost, jit, jit_o3
from pdjit.codegen.cpu.lib.pgemm import _micro_kernel

__all__ = ["takes", "transformed", "conv3x3"]

#: rows (output channels) and vectors of tiles of the products' register block: panels of
#: ``NR = 16 * WNV`` tiles (float32)
WMR, WNV = 14, 1
NR = 16 * WNV
_wmicro = _micro_kernel(WMR, WNV, 0)
#: bytes of a block's ``V`` and products together (kept in the L2 cache)
BLOCK_BYTES = 1 << 20
#: counts of calls, for tests that assert which kernel ran
CALLS = [0]


@jit
def _filter_transform(w, ut):
    """``ut[i * 4 + j, m, c] = (G w[m, c] G^T)[i, j]`` (float64 sums, stored as ``ut``'s) for
    ``G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]``."""
    m_, c_ = w.shape[0], w.shape[1]
    t = np.empty((4, 3))
    for m in range(m_):
        for c in range(c_):
            for k in range(3):  # G g: the rows of the transformed filter by columns
                g0, g1, g2 = float(w[m, c, 0, k]), float(w[m, c, 1, k]), float(w[m, c, 2, k])
                t[0, k] = g0
                t[1, k] = 0.5 * (g0 + g1 + g2)
                t[2, k] = 0.5 * (g0 - g1 + g2)
                t[3, k] = g2
            for i in range(4):  # (G g) G^T
                g0, g1, g2 = t[i, 0], t[i, 1], t[i, 2]
                ut[i * 4, m, c] = g0
                ut[i * 4 + 1, m, c] = 0.5 * (g0 + g1 + g2)
                ut[i * 4 + 2, m, c] = 0.5 * (g0 - g1 + g2)
                ut[i * 4 + 3, m, c] = g2


def _make(w4):
    ut = np.empty((16, w4.shape[0], w4.shape[1]), w4.dtype)
    _filter_transform(w4, ut)
    return ut


def transformed(w):
    """``(U, row)``: the transformed filter of a whole array of filters (``[16, M_all, C]``)
    and the row at which ``w``'s output channels start in it; ``w`` a C-contiguous
    ``[M, C, 3, 3]`` array or a slice of one along its first axis. Kept beside that array
    (:func:`pdjit.codegen.params.derived`)."""
    root = w.base if isinstance(w.base, np.ndarray) else None
    if root is not None and root.ndim == 4 and root.shape[1:] == w.shape[1:] and \
            root.dtype == w.dtype and root.flags.c_contiguous:
        step = w[0].nbytes
        off = w.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        if off % step == 0 and 0 <= off // step and off // step + w.shape[0] <= root.shape[0]:
            return params.derived(root, "winograd", lambda: _make(root)), off // step
    return params.derived(w, "winograd", lambda: _make(w)), 0


#: the shape classes on Winograd (else the taps kernel): from planes of ``_MIN_PLANE``
#: outputs, ``_MIN_CHANNELS`` input and output channels
_MIN_PLANE = 16
_MIN_CHANNELS = 16


def takes(x, w, y, sh, sw, pt, pl, dh, dw, groups) -> bool:
    """Whether :func:`conv3x3` serves the convolution (a 3x3 stride-1 filter on float32 data,
    paddings not past the filter's reach, see the shape classes above)."""
    if x.dtype != np.float32 or w.dtype != np.float32 or y.dtype != np.float32 or \
            groups != 1 or sh != 1 or sw != 1 or dh != 1 or dw != 1 or \
            w.shape[2] != 3 or w.shape[3] != 3:
        return False
    oh, ow = y.shape[2], y.shape[3]
    return 0 <= pt <= 2 and 0 <= pl <= 2 and oh + 2 - x.shape[2] - pt >= 0 and \
        ow + 2 - x.shape[3] - pl >= 0 and oh * ow >= _MIN_PLANE and \
        w.shape[0] >= _MIN_CHANNELS and w.shape[1] >= _MIN_CHANNELS and \
        x.flags.c_contiguous and y.flags.c_contiguous and w.flags.c_contiguous


def conv3x3(x, w, y, n0, n1, pt, pl, bias, lo, hi, res):
    """``y[n] = minimum(maximum(conv(x[n], w) + bias[m] + res, lo), hi)`` for the samples
    ``n0..n1`` by F(2x2, 3x3) (a convolution that :func:`takes` takes)."""
    ut, row = transformed(w)
    CALLS[0] += 1
    _wino_range(x, ut, row, y, n0, n1, pt, pl, bias, float(lo), float(hi), res)


@jit
def block_tiles(c_, m_, tw):
    """Tile rows per block: ``V`` (``16 C`` values per tile) and the products (``16 M``)
    within :data:`BLOCK_BYTES`, at least one tile row."""
    return max(1, BLOCK_BYTES // (64 * (c_ + m_)) // tw)


@jit_o3
def _wino_range(x, ut, row, y, n0, n1, pt, pl, bias, lo, hi, res):
    """:func:`conv3x3`'s kernel: ``ut`` the transformed filters (``[16, M_all, C]``), ``y``'s
    channels from row ``row`` of it."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    m_, oh_, ow_ = y.shape[1], y.shape[2], y.shape[3]
    mt = ut.shape[1]
    if ut.shape[0] != 16 or ut.shape[2] != c_ or row < 0 or row + m_ > mt or \
            x.shape[0] != y.shape[0] or n0 < 0 or n1 > x.shape[0] or \
            (bias.size != 0 and bias.size != m_) or (res.size != 0 and res.size != y.size):
        raise ValueError("pdjit: convolution operands do not fit each other")
    if n1 <= n0 or oh_ == 0 or ow_ == 0:
        return
    th, tw = (oh_ + 1) // 2, (ow_ + 1) // 2
    nrows = (n1 - n0) * th
    kb = min(nrows, block_tiles(c_, m_, tw))
    tmax = (kb * tw + NR - 1) // NR * NR
    v = np.empty(16 * c_ * tmax, np.float32)
    mo = np.empty(16 * m_ * tmax, np.float32)
    wp = 2 * tw + 2
    rb = np.zeros(4 * wp, np.float32)  # four input rows, zero-padded
    eo = np.empty(8 * (tw + 1), np.float32)  # their row combinations, even / odd columns
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    utf = ut.reshape(ut.size)
    none = bias[:0]
    flo, fhi = np.float32(lo), np.float32(hi)
    has_bias, has_res = bias.size != 0, res.size != 0
    cnt = min(w_, wp - pl)
    for r0 in range(0, nrows, kb):
        r1 = min(nrows, r0 + kb)
        tb = (r1 - r0) * tw
        tp = (tb + NR - 1) // NR * NR
        cs = c_ * tp
        # ---- input transform: V_xi[c, t] into panels of NR tiles
        for r in range(r0, r1):
            n = n0 + r // th
            ty = r % th
            base = (r - r0) * tw
            for c in range(c_):
                for k in range(4):
                    iy = 2 * ty - pt + k
                    if 0 <= iy < h_:
                        s = ((n * c_ + c) * h_ + iy) * w_
                        for q in range(cnt):
                            rb[k * wp + pl + q] = xf[s + q]
                    else:
                        for q in range(cnt):
                            rb[k * wp + pl + q] = 0.0
                w1 = tw + 1
                for p in range(2 * w1):
                    q, par = p // 2, p % 2
                    d0, d1, d2, d3 = rb[p], rb[wp + p], rb[2 * wp + p], rb[3 * wp + p]
                    eo[par * w1 + q] = d0 - d2
                    eo[(2 + par) * w1 + q] = d1 + d2
                    eo[(4 + par) * w1 + q] = d2 - d1
                    eo[(6 + par) * w1 + q] = d1 - d3
                tx = 0
                while tx < tw:
                    t = base + tx
                    j = t // NR
                    qo = t - j * NR
                    seg = min(tw - tx, NR - qo)
                    off = (j * c_ + c) * NR + qo - tx
                    for u in range(tx, tx + seg):
                        for i in range(4):
                            e0, o0 = eo[2 * i * w1 + u], eo[(2 * i + 1) * w1 + u]
                            e1, o1 = eo[2 * i * w1 + u + 1], eo[(2 * i + 1) * w1 + u + 1]
                            v[(4 * i) * cs + off + u] = e0 - e1
                            v[(4 * i + 1) * cs + off + u] = o0 + e1
                            v[(4 * i + 2) * cs + off + u] = e1 - o0
                            v[(4 * i + 3) * cs + off + u] = o0 - o1
                    tx += seg
        # ---- the 16 products M_xi [m_, tp] = U_xi [m_, c_] @ V_xi [c_, tp]
        ms = m_ * tp
        for xi in range(16):
            for m0 in range(0, m_, WMR):
                rows = min(WMR, m_ - m0)
                for j in range(tp // NR):
                    _wmicro(utf, (xi * mt + row + m0) * c_, c_, rows, c_, v, xi * cs + j * c_ * NR,
                            mo, xi * ms + m0 * tp + j * NR, tp, min(NR, tb - j * NR), none, 0,
                            none, -np.inf, np.inf)
        # ---- output transform, epilogue, stores
        for r in range(r0, r1):
            n = n0 + r // th
            ty = r % th
            base = (r - r0) * tw
            rows2 = 2 if 2 * ty + 1 < oh_ else 1
            for m in range(m_):
                b = bias[m] if has_bias else np.float32(0.0)
                o = ((n * m_ + m) * oh_ + 2 * ty) * ow_
                mb = m * tp + base
                for u in range(tw):
                    # A^T M A: R[i][0] = M[i][0] + M[i][1] + M[i][2],
                    # R[i][1] = M[i][1] - M[i][2] - M[i][3], then the same down the columns
                    k = mb + u
                    r00 = mo[k] + mo[ms + k] + mo[2 * ms + k]
                    r10 = mo[4 * ms + k] + mo[5 * ms + k] + mo[6 * ms + k]
                    r20 = mo[8 * ms + k] + mo[9 * ms + k] + mo[10 * ms + k]
                    r30 = mo[12 * ms + k] + mo[13 * ms + k] + mo[14 * ms + k]
                    r01 = mo[ms + k] - mo[2 * ms + k] - mo[3 * ms + k]
                    r11 = mo[5 * ms + k] - mo[6 * ms + k] - mo[7 * ms + k]
                    r21 = mo[9 * ms + k] - mo[10 * ms + k] - mo[11 * ms + k]
                    r31 = mo[13 * ms + k] - mo[14 * ms + k] - mo[15 * ms + k]
                    q4 = (r00 + r10 + r20 + b, r01 + r11 + r21 + b,
                          r10 - r20 - r30 + b, r11 - r21 - r31 + b)
                    for e in range(4):
                        dy, dx = e // 2, e % 2
                        if dy < rows2 and 2 * u + dx < ow_:
                            at = o + dy * ow_ + 2 * u + dx
                            val = q4[e] + res[at] if has_res else q4[e]
                            val = val if not val < flo else flo
                            yf[at] = val if not val > fhi else fhi


compile_cost(2.0, _wino_range)
