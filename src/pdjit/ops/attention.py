"""``scaled_dot_product_attention``: attention's core, ``softmax(alpha * Q @ K^T + Mask) @ V``
over the last two dims, as one op. The inference pass ``fuse_attention``
(:mod:`pdjit.passes.attention`) builds it from a program's products, mask add and softmax
where the target runs it as one kernel; a program may also hold it itself.

Each of Q, K and V is read through a permutation of its axes (``q_perm``, ``k_perm``,
``v_perm``; empty: none) and the result is written through one (``out_perm``): the pass takes
a ``transpose`` of a head's layout into the op instead of copying the heads apart (a
``[batch, seq, heads, dim]`` projection read as ``[batch, heads, seq, dim]``). After its
permutation each operand is ``[..., Sq, D]`` (Q), ``[..., Sk, D]`` (K: one key a row),
``[..., Sk, Dv]`` (V), with the same batch dims; Mask broadcasts (NumPy's rule) to
``[..., Sq, Sk]``; the result ``R`` is ``[..., Sq, Dv]`` and ``Out = transpose(R,
out_perm)``. The softmax is ``softmax``'s (``x - max`` clipped at -64)."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ATTENTION,
    OPAQUE,
    AttentionCore,
    Float64,
    Ints,
    Opaque,
    RowWise,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype
from pdjit.ops.nn import _log_softmax


def _perm(perm, rank: int, slot: str) -> list:
    p = [int(a) for a in perm] if perm else list(range(rank))
    if sorted(p) != list(range(rank)):
        raise ShapeMismatch(f"scaled_dot_product_attention: expected {slot}_perm to be a "
                            f"permutation of 0..{rank - 1} (or empty), got {list(perm)}")
    return p


def _shapes(Q, K, V, Mask, q_perm, k_perm, v_perm, out_perm):
    """The operands' shapes after their permutations, and Out's."""
    if not Q.ndim == K.ndim == V.ndim >= 2:
        raise ShapeMismatch(f"scaled_dot_product_attention: expected Q, K and V of one rank "
                            f">= 2, got ranks {Q.ndim}, {K.ndim}, {V.ndim}")
    r = Q.ndim
    q, k, v = ([x.shape[a] for a in _perm(p, r, n)]
               for x, p, n in ((Q, q_perm, "q"), (K, k_perm, "k"), (V, v_perm, "v")))
    known = lambda a, b: a < 0 or b < 0 or a == b  # noqa: E731
    if not (all(map(known, q[:-2], k[:-2])) and all(map(known, q[:-2], v[:-2])) and
            known(q[-1], k[-1]) and known(k[-2], v[-2])):
        raise ShapeMismatch(f"scaled_dot_product_attention: Q {q}, K {k} and V {v} (after "
                            f"their permutations) do not fit: expected [..., Sq, D], "
                            f"[..., Sk, D], [..., Sk, Dv] with the same batch dims")
    res = q[:-1] + [v[-1]]
    if Mask is not None:
        scores = q[:-1] + [k[-2]]
        m = list(Mask.shape)
        if len(m) > r or any(not (a == 1 or known(a, b))
                             for a, b in zip(m[::-1], scores[::-1])):
            raise ShapeMismatch(f"scaled_dot_product_attention: Mask {m} does not broadcast "
                                f"to the scores {scores}")
    o = _perm(out_perm, r, "out")
    return [res[a] for a in o]


def _infer(Q, K, V, Mask=None, *, alpha, q_perm, k_perm, v_perm, out_perm):
    check_dtype(Q, FLOATS, "input Q")
    for n, x in (("K", K), ("V", V)) + ((("Mask", Mask),) if Mask is not None else ()):
        if x.dtype != Q.dtype:
            raise ShapeMismatch(f"scaled_dot_product_attention: expected {n} of Q's dtype "
                                f"{np.dtype(Q.dtype).name}, got {np.dtype(x.dtype).name}")
    return {"Out": Q.with_(shape=tuple(_shapes(Q, K, V, Mask, q_perm, k_perm, v_perm,
                                               out_perm)))}


def _ref(Q, K, V, Mask=None, *, alpha, q_perm, k_perm, v_perm, out_perm):
    _shapes(Q, K, V, Mask, q_perm, k_perm, v_perm, out_perm)  # clear errors
    r = Q.ndim
    q, k, v = (np.transpose(x, _perm(p, r, n))
               for x, p, n in ((Q, q_perm, "q"), (K, k_perm, "k"), (V, v_perm, "v")))
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    if alpha != 1.0:
        s = s * np.asarray(alpha, Q.dtype)
    if Mask is not None:
        s = s + Mask
    if s.shape[-1]:
        s = _log_softmax(s, -1)[0]
    res = np.matmul(s, v).astype(Q.dtype, copy=False)
    return {"Out": np.ascontiguousarray(np.transpose(res, _perm(out_perm, r, "out")))}


def _rows(v):
    """Row ``i`` of the result depends on row ``i`` of Q, K, V (and Mask where it carries the
    batch) when every permutation keeps axis 0 first."""
    for n in ("q", "k", "v", "out"):
        p = list(v.attr(f"{n}_perm") or [])
        if p and int(p[0]) != 0:
            return f"{n}_perm={p} moves the batch axis"
    return None if v.rank("Q") >= 3 else "Q of rank 2 has no batch axis"


register_op(
    "scaled_dot_product_attention", inputs=["Q", "K", "V", "Mask?"], outputs=["Out"],
    attrs={"alpha": Float64(1.0, low=-2.0, high=2.0), "q_perm": Ints([]), "k_perm": Ints([]),
           "v_perm": Ints([]), "out_perm": Ints([])},
    row_wise=RowWise(batch=("Q", "K", "V", "Mask"), check=_rows),
    traits=[OPAQUE, ATTENTION], infer_shape=_infer, reference=_ref, emit=Opaque(), grad=None,
    form=lambda op: AttentionCore("Q", "K", "V", "Mask", "Out", "alpha",
                                  ("q_perm", "k_perm", "v_perm", "out_perm")),
    doc="Out = transpose(softmax(alpha * Q' @ K'^T + Mask) @ V', out_perm), where X' is X "
        "with its axes permuted by x_perm (empty: as it is); the softmax over the last axis, "
        "x - max clipped at -64.")
