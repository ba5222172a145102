"""Linear-chain CRF kernels: Fluid 1.x's ``linear_chain_crf`` (the negative log-likelihood of
each sequence's labels, forward algorithm), its gradient (forward-backward marginals) and
``crf_decoding`` (Viterbi); semantics in ``pdjit.ops.crf``.

The emission ``x`` arrives as rows ``[rows, D]``; the transition ``w`` is ``[D + 2, D]``: row 0
the start weights, row 1 the end weights, rows ``2 + i`` the weights of ``i -> j``. Sequence
``s`` is rows ``offs[s]:offs[s + 1]`` (``padded`` false: a LoD) or rows ``s * stride`` to
``s * stride + lens[s]`` of a padded batch (``padded``: ``stride`` is the padded length). Labels
are ``int64`` rows. The forward vectors ``alpha`` are kept normalised row by row (each row sums
to 1; the logarithms of the scales add up to ``log Z``), as Fluid's kernel keeps them, so the
long products never underflow; the gradient's backward vectors are normalised the same way.
Sums run in float64. A shape, LoD or label that does not fit, or probabilities that underflow
to zero, raise ``ValueError`` (the step then runs the op's reference, which names the
problem).
"""
import math

import numpy as np

from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jobs

__all__ = ["crf_nll", "crf_nll_grad", "crf_viterbi"]


@jit
def _bounds(offs, lens, padded, stride, rows):
    """``(begin, end)`` arrays of the sequences, checked against ``rows``."""
    if padded:
        n = lens.shape[0]
        b = np.empty(n, np.int64)
        e = np.empty(n, np.int64)
        for s in range(n):
            if lens[s] < 0 or lens[s] > stride:
                raise ValueError("pdjit: crf: a length does not fit the padded data")
            b[s] = s * stride
            e[s] = b[s] + lens[s]
        if n * stride != rows:
            raise ValueError("pdjit: crf: the lengths do not fit the padded data")
        return b, e
    n = offs.shape[0] - 1
    if n < 0 or offs[0] != 0 or offs[n] != rows:
        raise ValueError("pdjit: crf: the LoD does not fit the data")
    b = np.empty(n, np.int64)
    e = np.empty(n, np.int64)
    for s in range(n):
        b[s] = offs[s]
        e[s] = offs[s + 1]
        if e[s] < b[s]:
            raise ValueError("pdjit: crf: the LoD does not fit the data")
    return b, e


@jit
def _normalise(a, k, D):
    """Divide row ``k`` of ``a`` by its sum; the sum (float64), which must be > 0."""
    t = 0.0
    for i in range(D):
        t += a[k, i]
    if not t > 0.0:
        raise ValueError("pdjit: crf: the probabilities of all tag paths underflow to 0")
    for i in range(D):
        a[k, i] = a[k, i] / t
    return t


@by_address
@jit
def crf_nll(x, w, label, offs, lens, padded, stride, alpha, eexp, wexp, nll):
    """``nll[s, 0]`` = ``log Z - score(labels)`` of each sequence (0 for an empty one);
    ``eexp`` = ``exp(x - max of its row)`` for every row, ``wexp = exp(w)``, ``alpha`` the
    normalised forward vectors (zeros on rows outside every sequence)."""
    rows, D = x.shape
    if w.shape[0] != D + 2 or w.shape[1] != D or label.shape[0] != rows or \
            alpha.shape != x.shape or eexp.shape != x.shape or wexp.shape != w.shape:
        raise ValueError("pdjit: linear_chain_crf: the shapes do not fit")
    b, e = _bounds(offs, lens, padded, stride, rows)
    n = b.shape[0]
    if nll.shape[0] != n:
        raise ValueError("pdjit: linear_chain_crf: the shapes do not fit")
    for i in range(D + 2):
        for j in range(D):
            wexp[i, j] = math.exp(w[i, j])
    rmax = np.empty(rows, np.float64)
    for r in range(rows):
        m = x[r, 0] if D > 0 else 0.0
        for j in range(D):
            m = max(m, x[r, j])
        rmax[r] = m
        for j in range(D):
            eexp[r, j] = math.exp(x[r, j] - m)
            alpha[r, j] = 0.0
    for s in range(n):
        b0, e0 = b[s], e[s]
        if e0 == b0:
            nll[s, 0] = 0.0
            continue
        for r in range(b0, e0):
            if label[r] < 0 or label[r] >= D:
                raise ValueError("pdjit: linear_chain_crf: a label is out of range")
        for i in range(D):
            alpha[b0, i] = wexp[0, i] * eexp[b0, i]
        logz = rmax[b0] + math.log(_normalise(alpha, b0, D))
        for k in range(b0 + 1, e0):
            for i in range(D):
                t = 0.0
                for j in range(D):
                    t += alpha[k - 1, j] * wexp[j + 2, i]
                alpha[k, i] = eexp[k, i] * t
            logz += rmax[k] + math.log(_normalise(alpha, k, D))
        t = 0.0
        for i in range(D):
            t += alpha[e0 - 1, i] * wexp[1, i]
        logz += math.log(t)
        score = w[0, label[b0]] + w[1, label[e0 - 1]] + x[b0, label[b0]]
        for k in range(b0 + 1, e0):
            score += x[k, label[k]] + w[label[k - 1] + 2, label[k]]
        nll[s, 0] = logz - score


@by_address
@jit
def crf_nll_grad(eexp, wexp, label, alpha, dnll, offs, lens, padded, stride, dx, dw):
    """The gradients of :func:`crf_nll`'s ``nll`` (weighted by ``dnll[s]``): ``dx`` (rows
    outside every sequence zero) and ``dw`` (empty arrays: not wanted), from the marginals of
    single tags and of tag pairs under the CRF minus the labels' indicators."""
    rows, D = eexp.shape
    want_dx, want_dw = dx.shape[0] > 0, dw.shape[0] > 0
    if wexp.shape[0] != D + 2 or wexp.shape[1] != D or label.shape[0] != rows or \
            alpha.shape != eexp.shape or (want_dx and dx.shape != eexp.shape) or \
            (want_dw and dw.shape != wexp.shape):
        raise ValueError("pdjit: linear_chain_crf_grad: the shapes do not fit")
    b, e = _bounds(offs, lens, padded, stride, rows)
    n = b.shape[0]
    if dnll.shape[0] != n:
        raise ValueError("pdjit: linear_chain_crf_grad: the shapes do not fit")
    if want_dx:
        for r in range(rows):
            for j in range(D):
                dx[r, j] = 0.0
    if want_dw:
        for i in range(D + 2):
            for j in range(D):
                dw[i, j] = 0.0
    longest = 0
    for s in range(n):
        longest = max(longest, e[s] - b[s])
    beta = np.empty((longest, D), np.float64)
    marg = np.empty((longest, D), np.float64)
    pair = np.empty((D, D), np.float64)
    for s in range(n):
        b0, L = b[s], e[s] - b[s]
        if L == 0:
            continue
        g = dnll[s, 0]
        for r in range(b0, b0 + L):
            if label[r] < 0 or label[r] >= D:
                raise ValueError("pdjit: linear_chain_crf_grad: a label is out of range")
        for i in range(D):
            beta[L - 1, i] = wexp[1, i]
        _normalise(beta, L - 1, D)
        for k in range(L - 2, -1, -1):
            for i in range(D):
                t = 0.0
                for j in range(D):
                    t += wexp[i + 2, j] * eexp[b0 + k + 1, j] * beta[k + 1, j]
                beta[k, i] = t
            _normalise(beta, k, D)
        for k in range(L):
            t = 0.0
            for i in range(D):
                marg[k, i] = alpha[b0 + k, i] * beta[k, i]
                t += marg[k, i]
            if not t > 0.0:
                raise ValueError("pdjit: crf: the probabilities of all tag paths underflow to 0")
            for i in range(D):
                marg[k, i] /= t
        if want_dx:
            for k in range(L):
                for i in range(D):
                    dx[b0 + k, i] = g * marg[k, i]
                dx[b0 + k, label[b0 + k]] -= g
        if want_dw:
            for i in range(D):
                dw[0, i] += g * marg[0, i]
                dw[1, i] += g * marg[L - 1, i]
            dw[0, label[b0]] -= g
            dw[1, label[b0 + L - 1]] -= g
            for k in range(1, L):
                t = 0.0
                for i in range(D):
                    for j in range(D):
                        p = alpha[b0 + k - 1, i] * wexp[i + 2, j] * eexp[b0 + k, j] * beta[k, j]
                        pair[i, j] = p
                        t += p
                if not t > 0.0:
                    raise ValueError("pdjit: crf: the probabilities of all tag paths underflow "
                                     "to 0")
                for i in range(D):
                    for j in range(D):
                        dw[i + 2, j] += g * pair[i, j] / t
                dw[label[b0 + k - 1] + 2, label[b0 + k]] -= g


@by_address
@jit
def crf_viterbi(x, w, label, offs, lens, padded, stride, path):
    """``path[r]`` = the tag of row ``r`` on the best path of its sequence (ties: the lowest
    tag), or with labels (``label`` with rows) 1 where it equals the label and 0 elsewhere;
    rows outside every sequence 0."""
    rows, D = x.shape
    if w.shape[0] != D + 2 or w.shape[1] != D or path.shape[0] != rows or \
            (label.shape[0] > 0 and label.shape[0] != rows):
        raise ValueError("pdjit: crf_decoding: the shapes do not fit")
    b, e = _bounds(offs, lens, padded, stride, rows)
    for r in range(rows):
        path[r] = 0
    longest = 0
    for s in range(b.shape[0]):
        longest = max(longest, e[s] - b[s])
    best = np.empty((longest, D), np.float64)
    track = np.zeros((longest, D), np.int64)
    lowest = -1.7976931348623157e308  # the lowest float64: a start no score stays below
    for s in range(b.shape[0]):
        b0, L = b[s], e[s] - b[s]
        if L == 0:
            continue
        for i in range(D):
            best[0, i] = w[0, i] + x[b0, i]
        for k in range(1, L):
            for i in range(D):
                m, arg = lowest, 0
                for j in range(D):
                    v = best[k - 1, j] + w[j + 2, i]
                    if v > m:
                        m, arg = v, j
                best[k, i] = m + x[b0 + k, i]
                track[k, i] = arg
        m, arg = lowest, 0
        for i in range(D):
            v = best[L - 1, i] + w[1, i]
            if v > m:
                m, arg = v, i
        path[b0 + L - 1] = arg
        for k in range(L - 1, 0, -1):
            arg = track[k, arg]
            path[b0 + k - 1] = arg
        if label.shape[0] > 0:
            for r in range(b0, b0 + L):
                path[r] = 1 if path[r] == label[r] else 0


# the argument types of the LoD form (2-D data of the op's dtype, int64 labels, offsets)
_I1 = (np.dtype(np.int64), 1)
jobs("crf_nll")(lambda T: [(crf_nll, ((T, 2), (T, 2), _I1, "lod", _I1, bool, int) +
                            ((T, 2),) * 4)])
jobs("crf_nll_grad")(lambda T: [(crf_nll_grad, ((T, 2), (T, 2), _I1, (T, 2), (T, 2), "lod",
                                                 _I1, bool, int, (T, 2), (T, 2)))])
jobs("crf_viterbi")(lambda T: [(crf_viterbi, ((T, 2), (T, 2), _I1, "lod", _I1, bool, int,
                                               _I1))])

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(1.4, crf_nll_grad)
compile_cost(1.1, crf_nll)
compile_cost(1.0, crf_viterbi)
