"""``cos_sim`` (Fluid 1.x's cosine similarity of rows) and its gradient.

``cos_sim`` (X, Y -> Out, XNorm, YNorm; PaddlePaddle's legacy op): X and Y have one rank (at
least 2) and the same trailing dims; each is read as rows (its first dim) of the flattened
trailing dims. Y has X's number of rows or one row, which every row of X is compared with.
``XNorm = |x_i|`` ``[N, 1]``, ``YNorm = |y_j|`` ``[N or 1, 1]``, ``Out = x_i . y_i / (XNorm
* YNorm)`` ``[N, 1]`` (as Fluid, no epsilon: a zero row gives NaN).

``cos_sim_grad`` reads X, Y, Out, XNorm, YNorm and Out@GRAD:
``X@GRAD = dOut * (y / (|x||y|) - Out * x / |x|^2)``, ``Y@GRAD = dOut * (x / (|x||y|) - Out *
y / |y|^2)``, summed over the rows of X when Y has one row.

Natively (float32/float64): host lines of NumPy array expressions (no compilation), the
references' operations in their order.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import OPAQUE, Opaque, default_grad, register_op
from pdjit.ops._common import FLOATS, check_dtype

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def _agree(a, b) -> bool:
    return a < 0 or b < 0 or a == b


def _cos_infer(X, Y):
    check_dtype(X, FLOATS, "cos_sim: input X")
    if Y.dtype != X.dtype:
        raise ShapeMismatch(f"cos_sim: expected Y of X's dtype {X.dtype}, got {Y.dtype}")
    if X.ndim < 2 or Y.ndim != X.ndim:
        raise ShapeMismatch(f"cos_sim: expected X and Y of one rank, at least 2, got X "
                            f"{list(X.shape)} and Y {list(Y.shape)}")
    if not all(_agree(a, b) for a, b in zip(X.shape[1:], Y.shape[1:])):
        raise ShapeMismatch(f"cos_sim: expected Y's dims after the first to be X's "
                            f"{list(X.shape[1:])}, got {list(Y.shape[1:])}")
    if Y.shape[0] not in (1, -1) and not _agree(X.shape[0], Y.shape[0]):
        raise ShapeMismatch(f"cos_sim: expected Y with 1 row or X's {X.shape[0]} rows, got "
                            f"{Y.shape[0]}")
    n = (X.shape[0], 1)
    return {"Out": X.with_(shape=n), "XNorm": X.with_(shape=n, lod_level=0),
            "YNorm": Y.with_(shape=(Y.shape[0], 1), lod_level=0)}


def _check_rows(op: str, x: np.ndarray, y: np.ndarray) -> None:
    if x.shape[1] != y.shape[1] or y.shape[0] not in (1, x.shape[0]):
        raise ShapeMismatch(f"{op}: expected Y of shape [1 or {x.shape[0]}, ...] with X's "
                            f"trailing size {x.shape[1]}, got rows of {list(y.shape)}")


def _cos_ref(X, Y):
    x, y = _rows(X), _rows(Y)
    _check_rows("cos_sim", x, y)
    with np.errstate(all="ignore"):
        xn = np.sqrt(np.sum(x * x, axis=1, keepdims=True))
        yn = np.sqrt(np.sum(y * y, axis=1, keepdims=True))
        out = np.sum(x * y, axis=1, keepdims=True) / (xn * yn)
    t = X.dtype
    return {"Out": out.astype(t), "XNorm": xn.astype(t), "YNorm": yn.astype(t)}


def _cos_grad_ref(X, Y, Out, XNorm, YNorm, **kw):
    g = kw["Out@GRAD"].reshape(-1, 1)
    x, y = _rows(X), _rows(Y)
    _check_rows("cos_sim_grad", x, y)
    xn, yn, out = XNorm.reshape(-1, 1), YNorm.reshape(-1, 1), Out.reshape(-1, 1)
    if g.shape[0] != x.shape[0]:
        raise ShapeMismatch(f"cos_sim_grad: expected Out@GRAD of {x.shape[0]} rows, got "
                            f"{g.shape[0]}")
    with np.errstate(all="ignore"):
        dx = g * (y / (xn * yn) - out * x / (xn * xn))
        dy = g * (x / (xn * yn) - out * y / (yn * yn))
    if y.shape[0] == 1 and x.shape[0] != 1:
        dy = np.sum(dy, axis=0, keepdims=True)
    return {"X@GRAD": dx.reshape(X.shape).astype(X.dtype),
            "Y@GRAD": dy.reshape(Y.shape).astype(Y.dtype)}


def _rows_lines(ctx, slot: str, local: str) -> str:
    """Source binding ``local`` to ``slot``'s value as rows of its flattened trailing dims."""
    v = ctx.inp(slot)
    return f"{local} = {v}.reshape(({v}.shape[0], {ctx.prod(v, 1, ctx.rank(slot))}))"


def _native_pair(ctx) -> bool:
    return ctx.dtype("X") in _NATIVE and ctx.dtype("Y") == ctx.dtype("X") and \
        ctx.rank("X") >= 2 and ctx.rank("Y") == ctx.rank("X")


def _cos_lower(ctx):
    if not _native_pair(ctx):
        return None
    x2, y2, xn, yn = (ctx.tmp(h) for h in ("x", "y", "xn", "yn"))
    lines = [_rows_lines(ctx, "X", x2), _rows_lines(ctx, "Y", y2),
             f"_rt.check({x2}.shape[1] == {y2}.shape[1] and ({y2}.shape[0] == 1 or "
             f"{y2}.shape[0] == {x2}.shape[0]))",
             f"{xn} = np.sqrt(np.sum({x2} * {x2}, axis=1)).reshape(({x2}.shape[0], 1))",
             f"{yn} = np.sqrt(np.sum({y2} * {y2}, axis=1)).reshape(({y2}.shape[0], 1))",
             f"{ctx.out('Out')} = np.sum({x2} * {y2}, axis=1).reshape(({x2}.shape[0], 1)) / "
             f"({xn} * {yn})"]
    if ctx.has_output("XNorm"):
        lines.append(f"{ctx.out('XNorm')} = {xn}")
    if ctx.has_output("YNorm"):
        lines.append(f"{ctx.out('YNorm')} = {yn}")
    return lines


def _cos_grad_lower(ctx):
    if not _native_pair(ctx) or any(ctx.dtype(s) != ctx.dtype("X")
                                    for s in ("Out", "XNorm", "YNorm", "Out@GRAD")):
        return None
    x2, y2, xn, yn, o, g, w = (ctx.tmp(h) for h in ("x", "y", "xn", "yn", "o", "g", "w"))
    X, Y = ctx.inp("X"), ctx.inp("Y")

    def col(slot, local):
        v = ctx.inp(slot)
        return f"{local} = {v}.reshape(({v}.size, 1))"
    lines = [_rows_lines(ctx, "X", x2), _rows_lines(ctx, "Y", y2), col("XNorm", xn),
             col("YNorm", yn), col("Out", o), col("Out@GRAD", g),
             f"_rt.check({x2}.shape[1] == {y2}.shape[1] and ({y2}.shape[0] == 1 or "
             f"{y2}.shape[0] == {x2}.shape[0]) and {g}.shape[0] == {x2}.shape[0] and "
             f"{o}.shape[0] == {x2}.shape[0] and {xn}.shape[0] == {x2}.shape[0] and "
             f"{yn}.shape[0] == {y2}.shape[0])"]
    if ctx.has_output("X@GRAD"):
        lines.append(f"{ctx.out('X@GRAD')} = ({g} * ({y2} / ({xn} * {yn}) - {o} * {x2} / "
                     f"({xn} * {xn}))).reshape({X}.shape)")
    if ctx.has_output("Y@GRAD"):
        # each row of Y takes the sum over the rows of X compared with it (all, for one row)
        lines += [f"{w} = {g} * ({x2} / ({xn} * {yn}) - {o} * {y2} / ({yn} * {yn}))",
                  f"{ctx.out('Y@GRAD')} = np.sum({w}.reshape(({y2}.shape[0], {x2}.shape[0] // "
                  f"{y2}.shape[0], {x2}.shape[1])), axis=1).reshape({Y}.shape)"]
    return lines


register_op(
    "cos_sim", inputs=["X", "Y"], outputs=["Out", "XNorm~", "YNorm~"], traits=[OPAQUE],
    infer_shape=_cos_infer, reference=_cos_ref, emit=Opaque(_cos_lower, host=True),
    grad=default_grad("cos_sim_grad", fwd_inputs=("X", "Y"),
                      fwd_outputs=("Out", "XNorm", "YNorm"), wrt=("X", "Y")),
    doc="Out = the cosine similarity of each row of X with the same row of Y (or Y's one "
        "row); XNorm, YNorm the rows' norms.")

register_op(
    "cos_sim_grad", inputs=["X", "Y", "Out", "XNorm", "YNorm", "Out@GRAD"],
    outputs=["X@GRAD?", "Y@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda X, Y, **_: {"X@GRAD": X, "Y@GRAD": Y}, reference=_cos_grad_ref,
    emit=Opaque(_cos_grad_lower, host=True), grad=None,
    doc="The gradients of cos_sim with respect to X and Y.")
