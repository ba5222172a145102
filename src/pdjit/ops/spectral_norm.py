"""Fluid 1.8's ``spectral_norm``: ``Weight`` divided by its largest singular value, estimated by
power iteration, with its gradient.

``Weight`` is viewed as a matrix ``[h, w]``: axis ``dim`` first (``h`` its size), the other axes
flattened. Starting from the stored vectors ``U [h]`` and ``V [w]`` (as Fluid does, the stored
vectors themselves are not changed), ``power_iters`` times: ``v = W^T u / (|W^T u| + eps)``,
``u = W v / (|W v| + eps)``; then ``sigma = u . W v`` and ``Out = Weight / sigma``. The gradient
takes ``u`` and ``v`` as constants (Fluid's): ``(Out@GRAD - sum(Out@GRAD * W) u v^T / sigma) /
sigma`` in the matrix view. Runs its NumPy reference (``emit`` is ``None``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import OPAQUE, Float, Int, default_grad, register_op
from pdjit.ops._common import FLOATS, check_dtype

_ATTRS = {"dim": Int(0, low=0, high=1, axis_of="Weight"), "power_iters": Int(1, low=0, high=2),
          "eps": Float(1e-12, low=1e-12, high=1e-12)}


def _matrix(w, dim):
    perm = [dim] + [a for a in range(w.ndim) if a != dim]
    return np.transpose(w, perm).reshape(w.shape[dim], -1), perm


def _sigma(Weight, U, V, dim, power_iters, eps):
    m, perm = _matrix(Weight.astype(np.float64), dim)
    u, v = U.reshape(-1).astype(np.float64), V.reshape(-1).astype(np.float64)
    if u.size != m.shape[0] or v.size != m.shape[1]:
        raise ShapeMismatch(f"spectral_norm: expected U [{m.shape[0]}] and V [{m.shape[1]}], got "
                            f"{list(U.shape)} and {list(V.shape)}")
    e = float(np.float32(eps))
    for _ in range(power_iters):
        v = m.T @ u
        v = v / (np.linalg.norm(v) + e)
        u = m @ v
        u = u / (np.linalg.norm(u) + e)
    return m, perm, u, v, float(u @ m @ v)


def _unmatrix(mat, perm, shape):
    inv = np.argsort(perm)
    return np.transpose(mat.reshape([shape[p] for p in perm]), inv)


def _infer(Weight, U, V, *, dim, **_):
    check_dtype(Weight, FLOATS, "spectral_norm: Weight")
    if not 0 <= dim < max(Weight.ndim, 1) or Weight.ndim < 2:
        raise ShapeMismatch(f"spectral_norm: expected a Weight of rank >= 2 and dim in range, "
                            f"got {list(Weight.shape)} and dim {dim}")
    return {"Out": Weight}


def _ref(Weight, U, V, *, dim, power_iters, eps):
    m, perm, _, _, sigma = _sigma(Weight, U, V, dim, power_iters, eps)
    return {"Out": _unmatrix(m / sigma, perm, Weight.shape).astype(Weight.dtype)}


def _grad_ref(Weight, U, V, *, dim, power_iters, eps, **kw):
    m, perm, u, v, sigma = _sigma(Weight, U, V, dim, power_iters, eps)
    g, _ = _matrix(kw["Out@GRAD"].astype(np.float64), dim)
    dw = (g - (g * m).sum() * np.outer(u, v) / sigma) / sigma
    return {"Weight@GRAD": _unmatrix(dw, perm, Weight.shape).astype(Weight.dtype)}


register_op(
    "spectral_norm", inputs=["Weight", "U", "V"], outputs=["Out"], attrs=_ATTRS,
    traits=[OPAQUE], infer_shape=_infer, reference=_ref, emit=None,
    grad=default_grad("spectral_norm_grad", fwd_inputs=("Weight", "U", "V"), wrt=("Weight",)),
    doc="Weight divided by its spectral norm (power iteration from U and V).")
register_op(
    "spectral_norm_grad", inputs=["Weight", "U", "V", "Out@GRAD"], outputs=["Weight@GRAD?"],
    attrs=dict(_ATTRS), traits=[OPAQUE], infer_shape=lambda Weight, **_: {"Weight@GRAD": Weight},
    reference=_grad_ref, emit=None, grad=None, doc="Gradient of spectral_norm (u, v constant).")
